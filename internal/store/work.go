package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/jobs"
)

// WorkRow is one pending unit of stage work, as a drainer sees it.
type WorkRow struct {
	ID          int64
	MessageID   int64
	Stage       string
	Lane        string
	Seq         int64
	Channel     string
	Route       string
	Handler     string
	Destination string
	Attempts    int
	// DueIn is how long until the row may be attempted (zero when due), by
	// the database clock so that nodes with skewed clocks agree.
	DueIn time.Duration
	// Body is what the stage works on: the stored message for ingress and
	// routed rows, the transformed message for outbound rows.
	Body []byte
	// ControlID and MessageType come from the message, for file names and logs.
	ControlID   string
	MessageType string
	ReceivedAt  time.Time
}

// ErrFenced means the drainer execution is no longer the running one for its
// job: River rescued it and may have started it again elsewhere. The caller
// must roll back and stop without touching its lane again.
var ErrFenced = errors.New("drainer execution superseded (job rescued or finished elsewhere)")

// Fence checks, inside tx, that the drainer execution identified by job id and
// the attempted_at River stamped when it fetched the job is still the running
// one, and locks that river_job row until tx ends so a rescue cannot slip in
// before commit. The attempt number alone is not enough: a snooze gives the
// attempt back, so two executions can share it.
func Fence(ctx context.Context, tx pgx.Tx, jobID int64, attemptedAt time.Time) error {
	var one int
	err := tx.QueryRow(ctx, `
		SELECT 1 FROM river_job
		WHERE id = $1 AND state = 'running' AND attempted_at = $2
		FOR UPDATE`, jobID, attemptedAt).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrFenced
	}
	if err != nil {
		return fmt.Errorf("fence check of job %d: %w", jobID, err)
	}
	return nil
}

// PendingRows returns up to limit pending rows of a lane, head first.
func PendingRows(ctx context.Context, q DBTX, lane string, limit int) ([]WorkRow, error) {
	rows, err := q.Query(ctx, `
		SELECT w.id, w.message_id, w.stage, w.lane, w.seq, w.channel,
			coalesce(w.route, ''), coalesce(w.handler, ''), coalesce(w.destination, ''),
			w.attempts, greatest(0, extract(epoch FROM w.next_attempt_at - clock_timestamp()))::float8,
			coalesce(w.payload, m.raw, ''::bytea),
			coalesce(m.control_id, ''), coalesce(m.message_type, ''), m.received_at
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.lane = $1 AND w.status = 'pending'
		ORDER BY w.seq
		LIMIT $2`, lane, limit)
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkRow, error) {
		var w WorkRow
		var dueIn float64
		err := r.Scan(&w.ID, &w.MessageID, &w.Stage, &w.Lane, &w.Seq, &w.Channel,
			&w.Route, &w.Handler, &w.Destination, &w.Attempts, &dueIn, &w.Body,
			&w.ControlID, &w.MessageType, &w.ReceivedAt)
		w.DueIn = time.Duration(dueIn * float64(time.Second))
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	return out, nil
}

// CompleteIfEmpty takes the lane's lock and reports whether the lane has no
// pending row. The caller completes its drainer job in the same tx when it
// does; a producer blocked on the lock then finds no live drainer and
// activates a new one.
func CompleteIfEmpty(ctx context.Context, tx pgx.Tx, lane string) (bool, error) {
	if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
		return false, err
	}
	var pending bool
	err := tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM mefor_work WHERE lane = $1 AND status = 'pending')`, lane).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("check lane %s: %w", lane, err)
	}
	return !pending, nil
}

// consume marks a pending row done; false when it was no longer pending (an
// operator cancelled it meanwhile).
func consume(ctx context.Context, tx pgx.Tx, workID int64, status string) (bool, error) {
	tag, err := tx.Exec(ctx, `
		UPDATE mefor_work SET status = $2, updated_at = clock_timestamp(), finished_at = clock_timestamp()
		WHERE id = $1 AND status = 'pending'`, workID, status)
	if err != nil {
		return false, fmt.Errorf("finish work row %d: %w", workID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// RoutedOut is one handler invocation the router chose for a message.
type RoutedOut struct {
	Route   string
	Handler string
}

// RouteHandoff consumes an ingress row and writes one routed row per matched
// route (none: the message is unrouted).
func RouteHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row WorkRow, outs []RoutedOut) error {
	ok, err := consume(ctx, tx, row.ID, WorkDone)
	if err != nil || !ok {
		return err
	}
	if len(outs) == 0 {
		if _, err := tx.Exec(ctx, `UPDATE mefor_message SET status = 'unrouted', updated_at = clock_timestamp() WHERE id = $1`, row.MessageID); err != nil {
			return fmt.Errorf("mark message %d unrouted: %w", row.MessageID, err)
		}
		return AddEvent(ctx, tx, row.MessageID, EventUnrouted, row.ID, "", "no route matched")
	}
	lane := jobs.RoutedLane(row.Channel)
	if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
		return err
	}
	detail := ""
	for i, o := range outs {
		if _, err := tx.Exec(ctx, `
			INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler)
			VALUES ($1, 'routed', $2, $3, $4, $5)`,
			row.MessageID, lane, row.Channel, o.Route, o.Handler); err != nil {
			return fmt.Errorf("queue message %d for handler %s: %w", row.MessageID, o.Handler, err)
		}
		if i > 0 {
			detail += ", "
		}
		detail += o.Route
	}
	if _, err := tx.Exec(ctx, `UPDATE mefor_message SET status = 'routed', updated_at = clock_timestamp() WHERE id = $1`, row.MessageID); err != nil {
		return fmt.Errorf("mark message %d routed: %w", row.MessageID, err)
	}
	if err := AddEvent(ctx, tx, row.MessageID, EventRouted, row.ID, "", detail); err != nil {
		return err
	}
	return jobs.Activate(ctx, tx, ins, []string{lane})
}

// OutboundOut is one delivery a handler produced.
type OutboundOut struct {
	Destination string
	Lane        string
	Payload     []byte
}

// TransformHandoff consumes a routed row and writes one outbound row per
// delivery. No deliveries means the handler filtered the message.
func TransformHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row WorkRow, outs []OutboundOut) error {
	lanes := make([]string, 0, len(outs))
	for _, o := range outs {
		lanes = append(lanes, o.Lane)
	}
	// Lanes before the message lock (Finalize): every path takes them in that order.
	if err := jobs.LockLanes(ctx, tx, lanes); err != nil {
		return err
	}
	ok, err := consume(ctx, tx, row.ID, WorkDone)
	if err != nil || !ok {
		return err
	}
	for _, o := range outs {
		if _, err := tx.Exec(ctx, `
			INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, payload)
			VALUES ($1, 'outbound', $2, $3, $4, $5, $6, $7)`,
			row.MessageID, o.Lane, row.Channel, row.Route, row.Handler, o.Destination, o.Payload); err != nil {
			return fmt.Errorf("queue message %d for %s: %w", row.MessageID, o.Destination, err)
		}
	}
	event, detail := EventTransformed, row.Handler
	if len(outs) == 0 {
		event = EventFiltered
	}
	if err := AddEvent(ctx, tx, row.MessageID, event, row.ID, "", detail); err != nil {
		return err
	}
	if err := jobs.Activate(ctx, tx, ins, lanes); err != nil {
		return err
	}
	return Finalize(ctx, tx, row.MessageID)
}

// DeadLetter ends a row as dead with a reason (never message content) and
// finalizes its message; used for handler errors and rows whose destination
// or handler left the config.
func DeadLetter(ctx context.Context, tx pgx.Tx, row WorkRow, reason string) error {
	tag, err := tx.Exec(ctx, `
		UPDATE mefor_work SET status = 'dead', last_error = $2, updated_at = clock_timestamp(),
			finished_at = clock_timestamp()
		WHERE id = $1 AND status = 'pending'`, row.ID, reason)
	if err != nil {
		return fmt.Errorf("dead-letter work row %d: %w", row.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	if err := AddEvent(ctx, tx, row.MessageID, EventDead, row.ID, row.Destination, reason); err != nil {
		return err
	}
	return Finalize(ctx, tx, row.MessageID)
}

// Attempt is the outcome of one delivery attempt.
type Attempt struct {
	Outcome string // "delivered", or the failure class: "refused", "timeout", "AE", "AR", ...
	AckCode string
	Reply   []byte // what the partner answered, if anything
	Error   string // failure description, never message content
}

// Delivered records a successful delivery: the row is done, the partner's
// reply kept, the message finalized. false when an operator cancelled the row
// while it was being sent.
func Delivered(ctx context.Context, tx pgx.Tx, row WorkRow, a Attempt) (bool, error) {
	tag, err := tx.Exec(ctx, `
		UPDATE mefor_work SET status = 'done', attempts = attempts + 1, last_error = NULL,
			updated_at = clock_timestamp(), finished_at = clock_timestamp()
		WHERE id = $1 AND status = 'pending'`, row.ID)
	if err != nil {
		return false, fmt.Errorf("mark work row %d delivered: %w", row.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if err := saveResponse(ctx, tx, row, row.Attempts+1, a); err != nil {
		return false, err
	}
	if err := AddEvent(ctx, tx, row.MessageID, EventDelivered, row.ID, row.Destination, a.AckCode); err != nil {
		return false, err
	}
	return true, Finalize(ctx, tx, row.MessageID)
}

// Failed records a failed delivery attempt. With dead set the row is
// dead-lettered and the lane may move on; otherwise it stays at the head of
// its lane until backoff has passed (by the database clock).
func Failed(ctx context.Context, tx pgx.Tx, row WorkRow, a Attempt, backoff time.Duration, dead bool) error {
	status := WorkPending
	if dead {
		status = WorkDead
	}
	tag, err := tx.Exec(ctx, `
		UPDATE mefor_work SET attempts = attempts + 1, last_error = $2,
			next_attempt_at = clock_timestamp() + make_interval(secs => $3::float8),
			status = $4, updated_at = clock_timestamp(),
			finished_at = CASE WHEN $4 = 'dead' THEN clock_timestamp() END
		WHERE id = $1 AND status = 'pending'`, row.ID, a.Error, backoff.Seconds(), status)
	if err != nil {
		return fmt.Errorf("record failed attempt of work row %d: %w", row.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil // cancelled meanwhile
	}
	if err := saveResponse(ctx, tx, row, row.Attempts+1, a); err != nil {
		return err
	}
	if err := AddEvent(ctx, tx, row.MessageID, EventFailed, row.ID, row.Destination,
		fmt.Sprintf("attempt %d: %s", row.Attempts+1, a.Error)); err != nil {
		return err
	}
	if !dead {
		return nil
	}
	if err := AddEvent(ctx, tx, row.MessageID, EventDead, row.ID, row.Destination,
		fmt.Sprintf("gave up after %d attempts", row.Attempts+1)); err != nil {
		return err
	}
	return Finalize(ctx, tx, row.MessageID)
}

func saveResponse(ctx context.Context, tx pgx.Tx, row WorkRow, attempt int, a Attempt) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7)`,
		row.MessageID, row.ID, row.Destination, attempt, a.Outcome, a.AckCode, a.Reply)
	if err != nil {
		return fmt.Errorf("save reply for work row %d: %w", row.ID, err)
	}
	return nil
}
