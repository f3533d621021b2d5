package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	// CancelRequested is set when an operator asked for the row to be
	// cancelled while the lane's drainer was running: the drainer must
	// cancel it instead of sending it.
	CancelRequested bool
	// Held is set on an outbound row while a lane of another layout
	// generation of its destination has a pending row with a lower seq
	// (see layout.go): the destination's ordering changed, and rows queued
	// under the old one go first.
	Held bool
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
	err := tx.QueryRow(ctx, fenceSQL, jobID, attemptedAt).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrFenced
	}
	if err != nil {
		return fmt.Errorf("fence check of job %d: %w", jobID, err)
	}
	return nil
}

// fenceSQL finds the drainer's river_job row only while the execution is
// the running one, and locks it until the transaction ends.
const fenceSQL = `SELECT 1 FROM river_job WHERE id = $1 AND state = 'running' AND attempted_at = $2 FOR UPDATE`

// PendingRows returns up to limit pending rows of a lane, head first. For
// an outbound lane the same query reads the layout barrier (Held).
func PendingRows(ctx context.Context, q DBTX, lane string, limit int) ([]WorkRow, error) {
	stage, _, _ := strings.Cut(lane, ":")
	rows, err := q.Query(ctx, `
		SELECT w.id, w.message_id, w.stage, w.lane, w.seq, w.channel,
			coalesce(w.route, ''), coalesce(w.handler, ''), coalesce(w.destination, ''),
			w.attempts, w.cancel_requested_at IS NOT NULL,
			w.seq > coalesce(b.seq, w.seq),
			greatest(0, extract(epoch FROM w.next_attempt_at - clock_timestamp()))::float8,
			coalesce(w.payload, m.raw, ''::bytea),
			coalesce(m.control_id, ''), coalesce(m.message_type, ''), m.received_at
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		LEFT JOIN (`+layoutBarrierSQL+`) b ON $3
		WHERE w.lane = $1 AND w.status = 'pending'
		ORDER BY w.seq
		LIMIT $2`, lane, limit, stage == jobs.StageOutbound)
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkRow, error) {
		var w WorkRow
		var dueIn float64
		err := r.Scan(&w.ID, &w.MessageID, &w.Stage, &w.Lane, &w.Seq, &w.Channel,
			&w.Route, &w.Handler, &w.Destination, &w.Attempts, &w.CancelRequested, &w.Held, &dueIn, &w.Body,
			&w.ControlID, &w.MessageType, &w.ReceivedAt)
		w.DueIn = time.Duration(dueIn * float64(time.Second))
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	return out, nil
}

// layoutBarrierSQL is the lowest pending seq in the lanes of lane $1's
// destination that belong to another lane group (jobs.LaneGroup), that is,
// another layout generation. The lanes come from mefor_lane (a row per lane
// ever activated, few), each probed at its head.
const layoutBarrierSQL = `
	SELECT min(h.seq) AS seq
	FROM mefor_lane l
	CROSS JOIN LATERAL (
		SELECT x.seq FROM mefor_work x WHERE x.lane = l.name AND x.status = 'pending' ORDER BY x.seq LIMIT 1
	) h
	WHERE l.stage = 'outbound'
	  AND split_part(split_part(l.name, '#', 1), '~', 1) = split_part(split_part($1, '#', 1), '~', 1)
	  AND split_part(l.name, '#', 1) <> split_part($1, '#', 1)`

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

// RoutedOut is one handler invocation the router chose for a message.
type RoutedOut struct {
	Route   string
	Handler string
}

// RouteHandoff hands one ingress row off without a fence, for operator
// tools and tests; drainers use RouteBatch with their execution.
func RouteHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row WorkRow, outs []RoutedOut) error {
	return RouteBatch(ctx, tx, ins, NoFence, []WorkRow{row}, []RouteDecision{{Outs: outs}})
}

// OutboundOut is one delivery a handler produced.
type OutboundOut struct {
	Destination string
	Lane        string
	Payload     []byte
}

// TransformHandoff hands one routed row off without a fence, for operator
// tools and tests; drainers use TransformBatch with their execution.
func TransformHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row WorkRow, outs []OutboundOut) error {
	return TransformBatch(ctx, tx, ins, NoFence, []WorkRow{row}, []TransformDecision{{Outs: outs}})
}

// DeadLetter ends a row as dead with a reason (never message content) and
// finalizes its message; used for rows whose destination or handler left
// the config.
func DeadLetter(ctx context.Context, tx pgx.Tx, row WorkRow, reason string) error {
	h := newHandoff(NoFence)
	h.deadLetter([]WorkRow{row}, []string{reason})
	return h.run(ctx, tx, nil, nil)
}

// Attempt is the outcome of one delivery attempt.
type Attempt struct {
	Outcome string // "delivered", or the failure class: "refused", "timeout", "AE", "AR", ...
	AckCode string
	Reply   []byte // what the partner answered, if anything
	Error   string // failure description, never message content
	// DeadReason, for a failed attempt that ends the row, says why (never
	// message content); empty means it ran out of attempts.
	DeadReason string
}

// Delivered records a successful delivery without a fence, for operator
// tools and tests; drainers use RecordAttempt with their execution.
func Delivered(ctx context.Context, tx pgx.Tx, row WorkRow, a Attempt) (bool, error) {
	r, err := RecordAttempt(ctx, tx, NoFence, row, a, true, 0, false)
	return r.Recorded, err
}

// Failed records a failed delivery attempt without a fence, like Delivered.
func Failed(ctx context.Context, tx pgx.Tx, row WorkRow, a Attempt, backoff time.Duration, dead bool) error {
	_, err := RecordAttempt(ctx, tx, NoFence, row, a, false, backoff, dead)
	return err
}
