package auditforward

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/dbpool"
)

// Targets, as mefor_audit_forward.target, metric labels and alert rules
// name them.
const (
	TargetSyslog  = "syslog"
	TargetWebhook = "webhook"
)

// Cursor is how far a target's receiver has accepted the audit trail.
type Cursor struct {
	Target string `json:"target"`
	// Seq is the last audit row accepted; AnchorNo the last anchor.
	Seq      int64 `json:"audit_seq"`
	AnchorNo int64 `json:"anchor_no"`
	// SentAt is when the receiver last accepted a batch; FailedAt and
	// LastError the last failure since (nil and "" after a success).
	SentAt    *time.Time `json:"sent_at,omitempty"`
	FailedAt  *time.Time `json:"failed_at,omitempty"`
	LastError string     `json:"last_error,omitempty"`
}

// ErrCursorMoved is returned by an advance whose cursor someone else
// moved meanwhile (a stale run of a node that froze): nothing was changed.
var ErrCursorMoved = errors.New("the audit forward cursor moved meanwhile; another run forwards")

// IsCursorMoved reports whether err is, or wraps, ErrCursorMoved.
func IsCursorMoved(err error) bool { return errors.Is(err, ErrCursorMoved) }

const cursorColumns = `target, audit_seq, anchor_no, sent_at, failed_at, coalesce(last_error, '')`

func scanCursor(r pgx.CollectableRow) (Cursor, error) {
	var c Cursor
	err := r.Scan(&c.Target, &c.Seq, &c.AnchorNo, &c.SentAt, &c.FailedAt, &c.LastError)
	return c, err
}

// ReadCursor returns target's cursor, creating it at the log's start when
// the target is new: a new target is sent the whole log.
func ReadCursor(ctx context.Context, q dbpool.DBTX, target string) (Cursor, error) {
	if _, err := q.Exec(ctx, `INSERT INTO mefor_audit_forward (target) VALUES ($1) ON CONFLICT (target) DO NOTHING`, target); err != nil {
		return Cursor{}, fmt.Errorf("create the audit forward cursor of %s: %w", target, err)
	}
	rows, err := q.Query(ctx, `SELECT `+cursorColumns+` FROM mefor_audit_forward WHERE target = $1`, target)
	if err != nil {
		return Cursor{}, fmt.Errorf("read the audit forward cursor of %s: %w", target, err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, scanCursor)
	if err != nil {
		return Cursor{}, fmt.Errorf("read the audit forward cursor of %s: %w", target, err)
	}
	return c, nil
}

// Cursors returns every target's cursor, by target.
func Cursors(ctx context.Context, q dbpool.DBTX) ([]Cursor, error) {
	return dbpool.Rows(ctx, q, "read the audit forward cursors", scanCursor, `SELECT `+cursorColumns+` FROM mefor_audit_forward ORDER BY target`)
}

// advance moves from's cursor to seq and anchorNo, after its receiver
// accepted everything up to them; it refuses with ErrCursorMoved when the
// cursor is no longer at from.
func advance(ctx context.Context, q dbpool.DBTX, from Cursor, seq, anchorNo int64) error {
	tag, err := q.Exec(ctx, `
		UPDATE mefor_audit_forward SET audit_seq = $4, anchor_no = $5, sent_at = clock_timestamp(),
			failed_at = NULL, last_error = NULL, updated_at = clock_timestamp()
		WHERE target = $1 AND audit_seq = $2 AND anchor_no = $3`,
		from.Target, from.Seq, from.AnchorNo, seq, anchorNo)
	if err != nil {
		return fmt.Errorf("advance the audit forward cursor of %s to row %d: %w", from.Target, seq, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("advance the audit forward cursor of %s from row %d: %w", from.Target, from.Seq, ErrCursorMoved)
	}
	return nil
}

// recordFailure notes that target's receiver did not accept a batch.
// errText names the receiver and what failed, never audit content.
func recordFailure(ctx context.Context, q dbpool.DBTX, target, errText string) error {
	_, err := q.Exec(ctx, `
		UPDATE mefor_audit_forward SET failed_at = clock_timestamp(), last_error = $2, updated_at = clock_timestamp()
		WHERE target = $1`, target, errText)
	if err != nil {
		return fmt.Errorf("record the audit forward failure of %s: %w", target, err)
	}
	return nil
}

// Forget removes the cursors of targets not in keep: a target taken out
// of the config stops counting as behind, and one added back later is sent
// the whole log again.
func Forget(ctx context.Context, q dbpool.DBTX, keep []string) error {
	if keep == nil {
		keep = []string{}
	}
	if _, err := q.Exec(ctx, `DELETE FROM mefor_audit_forward WHERE target <> ALL($1::text[])`, keep); err != nil {
		return fmt.Errorf("forget audit forward targets no longer configured: %w", err)
	}
	return nil
}

// Lag is how far a target is behind the log.
type Lag struct {
	Target string
	// Rows is how many audit rows it has not yet had accepted.
	Rows int64
	// OldestSeconds is the age of the oldest of them, by the database
	// clock; 0 when none.
	OldestSeconds float64
}

// lagColumns computes a target's lag from its cursor's audit_seq (f): the
// rows after it and the age of the first of them.
const lagColumns = `
	greatest(coalesce((SELECT max(seq) FROM mefor_audit), 0) - f.audit_seq, 0),
	coalesce(extract(epoch FROM clock_timestamp() - (SELECT at FROM mefor_audit WHERE seq = f.audit_seq + 1)), 0)::float8`

// LagOf reads target's lag; a target that never ran yet is behind by the
// whole log.
func LagOf(ctx context.Context, q dbpool.DBTX, target string) (Lag, error) {
	l := Lag{Target: target}
	err := q.QueryRow(ctx, `
		SELECT `+lagColumns+`
		FROM (SELECT coalesce((SELECT audit_seq FROM mefor_audit_forward WHERE target = $1), 0) AS audit_seq) f`, target).
		Scan(&l.Rows, &l.OldestSeconds)
	if err != nil {
		return Lag{}, fmt.Errorf("read the audit forward lag of %s: %w", target, err)
	}
	return l, nil
}

// Lags reads the lag of every target that has a cursor.
func Lags(ctx context.Context, q dbpool.DBTX) ([]Lag, error) {
	return dbpool.Rows(ctx, q, "read the audit forward lag", func(r pgx.CollectableRow) (Lag, error) {
		var l Lag
		err := r.Scan(&l.Target, &l.Rows, &l.OldestSeconds)
		return l, err
	}, `SELECT f.target, `+lagColumns+` FROM mefor_audit_forward f ORDER BY f.target`)
}

// Status is a target's cursor with its lag, as `mefor status` shows it.
type Status struct {
	Cursor
	LagRows       int64   `json:"lag_rows"`
	OldestSeconds float64 `json:"oldest_unsent_seconds"`
}

// ReadStatus returns every target's cursor and lag, by target.
func ReadStatus(ctx context.Context, q dbpool.DBTX) ([]Status, error) {
	cs, err := Cursors(ctx, q)
	if err != nil {
		return nil, err
	}
	lags, err := Lags(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(cs))
	for _, c := range cs {
		st := Status{Cursor: c}
		for _, l := range lags {
			if l.Target == c.Target {
				st.LagRows, st.OldestSeconds = l.Rows, l.OldestSeconds
			}
		}
		out = append(out, st)
	}
	return out, nil
}
