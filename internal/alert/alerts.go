// Package alert owns the alert tables: each rule's state (mefor_alert) and
// the record of its notifications, with the reads the alert rules evaluate.
package alert

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
)

// Alert states (mefor_alert.state) and notification kinds.
const (
	AlertOK       = "ok"
	AlertFiring   = "firing"
	AlertResolved = "resolved" // a notification, not a state: the rule went back to ok
)

// Alert is one rule's row of mefor_alert.
type Alert struct {
	Rule        string     `json:"rule"`
	State       string     `json:"state"`
	Since       time.Time  `json:"since"`
	Condition   string     `json:"condition,omitempty"`
	Value       *float64   `json:"value,omitempty"`
	Threshold   *float64   `json:"threshold,omitempty"`
	Transitions int64      `json:"transitions"`
	EvaluatedAt *time.Time `json:"evaluated_at,omitempty"`
	// The last notification sent (or being retried) and to which sink.
	LastNotifiedAt   *time.Time `json:"last_notified_at,omitempty"`
	LastNotification string     `json:"last_notification,omitempty"`
	LastSink         string     `json:"last_sink,omitempty"`
	LastNotifyError  string     `json:"last_notify_error,omitempty"`
}

const alertColumns = `rule, state, since, coalesce(condition, ''), value, threshold, transitions, evaluated_at,
	last_notified_at, coalesce(last_notification, ''), coalesce(last_sink, ''), coalesce(last_notify_error, '')`

func scanAlert(r pgx.CollectableRow) (Alert, error) {
	var a Alert
	err := r.Scan(&a.Rule, &a.State, &a.Since, &a.Condition, &a.Value, &a.Threshold, &a.Transitions, &a.EvaluatedAt,
		&a.LastNotifiedAt, &a.LastNotification, &a.LastSink, &a.LastNotifyError)
	return a, err
}

// ListAlerts returns every rule's state, by rule name.
func ListAlerts(ctx context.Context, q pipeline.DBTX) ([]Alert, error) {
	return dbpool.Rows(ctx, q, "list alerts", scanAlert, `SELECT `+alertColumns+` FROM mefor_alert ORDER BY rule`)
}

// LockAlerts makes sure rules have a row (state ok, since now), removes
// the rows of rules no longer configured, and locks the rest until tx ends,
// so two evaluations (a leader change, a run by hand) serialize and the
// second sees what the first recorded.
func LockAlerts(ctx context.Context, tx pgx.Tx, rules []string) (map[string]Alert, error) {
	if _, err := tx.Exec(ctx, `DELETE FROM mefor_alert WHERE rule <> ALL($1::text[])`, rules); err != nil {
		return nil, fmt.Errorf("drop alerts of removed rules: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mefor_alert (rule) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT (rule) DO NOTHING`, rules); err != nil {
		return nil, fmt.Errorf("add alert rules: %w", err)
	}
	list, err := dbpool.Rows(ctx, tx, "lock alerts", scanAlert, `SELECT `+alertColumns+` FROM mefor_alert WHERE rule = ANY($1::text[]) ORDER BY rule FOR UPDATE`, rules)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Alert, len(list))
	for _, a := range list {
		out[a.Rule] = a
	}
	return out, nil
}

// UpdateAlert records an evaluation of a rule locked by LockAlerts. With
// changed set the rule enters state (since now, one more transition);
// otherwise only its condition and value are refreshed. It returns the row
// as recorded.
func UpdateAlert(ctx context.Context, tx pgx.Tx, rule, state string, changed bool, condition string, value, threshold *float64) (Alert, error) {
	rows, err := tx.Query(ctx, `
		UPDATE mefor_alert SET
			state = $2,
			since = CASE WHEN $3 THEN clock_timestamp() ELSE since END,
			transitions = transitions + CASE WHEN $3 THEN 1 ELSE 0 END,
			condition = NULLIF($4, ''), value = $5, threshold = $6,
			evaluated_at = clock_timestamp()
		WHERE rule = $1
		RETURNING `+alertColumns, rule, state, changed, condition, value, threshold)
	if err != nil {
		return Alert{}, fmt.Errorf("record alert %s: %w", rule, err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanAlert)
	if err != nil {
		return Alert{}, fmt.Errorf("record alert %s: %w", rule, err)
	}
	return a, nil
}

// RecordNotification notes the outcome of sending a rule's notification
// to sink: errText empty for a success. It never holds header values.
func RecordNotification(ctx context.Context, q pipeline.DBTX, rule, sink, notification, errText string) error {
	_, err := q.Exec(ctx, `
		UPDATE mefor_alert SET last_notification = $3, last_sink = $2, last_notify_error = NULLIF($4, ''),
			last_notified_at = CASE WHEN $4 = '' THEN clock_timestamp() ELSE last_notified_at END
		WHERE rule = $1`, rule, sink, notification, errText)
	if err != nil {
		return fmt.Errorf("record notification of alert %s: %w", rule, err)
	}
	return nil
}

// CountDead counts the dead-lettered rows of a destination, or of a
// channel when destination is empty (rows not replayed or cancelled since),
// from the summary counts (counts.go): exact, and as cheap with a million
// dead letters as with none.
func CountDead(ctx context.Context, q pipeline.DBTX, destination, channel string) (int64, error) {
	var n int64
	var err error
	if destination != "" {
		err = q.QueryRow(ctx, `
			SELECT coalesce(sum(n), 0)::bigint FROM mefor_work_count
			WHERE status = 'dead' AND destination = $1`, destination).Scan(&n)
	} else {
		err = q.QueryRow(ctx, `
			SELECT coalesce(sum(n), 0)::bigint FROM mefor_work_count
			WHERE status = 'dead' AND channel = $1`, channel).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// CountTampered counts the rows of a destination, or of a channel when
// destination is empty, dead-lettered as tampered (pipeline.TamperedReason,
// stored in clear for this count) and not replayed or cancelled since.
func CountTampered(ctx context.Context, q pipeline.DBTX, destination, channel string) (int64, error) {
	col, v := "destination", destination
	if destination == "" {
		col, v = "channel", channel
	}
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE status = 'dead' AND `+col+` = $1 AND starts_with(last_error, $2)`,
		v, pipeline.TamperedPrefix).Scan(&n); err != nil {
		return 0, fmt.Errorf("count tampered rows: %w", err)
	}
	return n, nil
}

// SecondsSinceTraffic is how long ago the channel last received a message,
// or the destination last had a delivery queued for it, by the database
// clock; ok is false when it never did.
func SecondsSinceTraffic(ctx context.Context, q pipeline.DBTX, destination, channel string) (secs float64, ok bool, err error) {
	var v *float64
	if destination != "" {
		err = q.QueryRow(ctx, `
			SELECT extract(epoch FROM clock_timestamp() - (
				SELECT created_at FROM mefor_work WHERE destination = $1 ORDER BY message_id DESC LIMIT 1))::float8`,
			destination).Scan(&v)
	} else {
		err = q.QueryRow(ctx, `
			SELECT extract(epoch FROM clock_timestamp() - (
				SELECT received_at FROM mefor_message WHERE channel = $1 ORDER BY id DESC LIMIT 1))::float8`,
			channel).Scan(&v)
	}
	if err != nil {
		return 0, false, fmt.Errorf("read last traffic: %w", err)
	}
	if v == nil {
		return 0, false, nil
	}
	return *v, true, nil
}
