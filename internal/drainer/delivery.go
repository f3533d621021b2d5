package drainer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
)

// Attempt is the outcome of one delivery attempt.
type Attempt struct {
	Outcome string // "delivered", or the failure class: "refused", "timeout", "AE", "AR", ...
	AckCode string
	Reply   []byte // what the partner answered, if anything
	Error   string // failure description, never message content
	// DeadReason, for a failed attempt that ends the row, says why (never
	// message content); empty means it ran out of attempts.
	DeadReason string
	// ReplyTo, on a delivered attempt, routes Reply into a channel in the
	// same transaction (reply.go).
	ReplyTo *ReplyRoute
}

// Delivered records a successful delivery without a fence, for operator
// tools and tests; drainers use RecordAttempt with their execution.
func Delivered(ctx context.Context, tx pgx.Tx, row Row, a Attempt) (bool, error) {
	r, err := RecordAttempt(ctx, tx, NoFence, row, a, true, 0, false)
	return r.Recorded, err
}

// Failed records a failed delivery attempt without a fence, like Delivered.
func Failed(ctx context.Context, tx pgx.Tx, row Row, a Attempt, backoff time.Duration, dead bool) error {
	_, err := RecordAttempt(ctx, tx, NoFence, row, a, false, backoff, dead)
	return err
}

// Recorded is what RecordAttempt found.
type Recorded struct {
	// Recorded is false when the row was no longer pending.
	Recorded bool
	// CancelsPending is true when rows of the lane are marked for
	// cancelling (an operator cancelled them while this drainer was
	// running): the drainer must resolve them (CancelMarked) before it
	// sends anything else. A marked row it just sent is recorded as
	// delivered all the same.
	CancelsPending bool
}

// RecordAttempt records one delivery attempt of row in one round trip: the
// fence, the row (done; or its attempt, error and next attempt; or dead),
// the partner's reply, the events and, when the row ended, the finalizer.
// A delivered attempt with a.ReplyTo also stores the reply as a message of
// that channel, in the same transaction (reply.go).
// The same round trip asks whether rows of the lane are marked for
// cancelling, an index probe that costs nothing while none are.
func RecordAttempt(ctx context.Context, tx pgx.Tx, ex Execution, row Row, a Attempt, delivered bool, backoff time.Duration, dead bool) (Recorded, error) {
	return recordAttempt(ctx, tx, ex, row, a, delivered, backoff, dead, nil)
}

// RecordCrash counts, for a drainer execution that follows one that died
// (River or reclaim rescued the job), the attempt the dead one may have been
// making on the lane's head when it died: a send that crashes the node must
// count toward max_attempts, or a message that kills the node every time
// would block its lane forever. It is recorded as a failed attempt with
// outcome a.Outcome, ending the row when dead, and only when the row was
// already due at diedAt (the rescue; nil when unknown: always): a row that
// became due after it was never in flight.
func RecordCrash(ctx context.Context, tx pgx.Tx, ex Execution, row Row, a Attempt, diedAt *time.Time, dead bool) (Recorded, error) {
	return recordAttempt(ctx, tx, ex, row, a, false, 0, dead, diedAt)
}

func recordAttempt(ctx context.Context, tx pgx.Tx, ex Execution, row Row, a Attempt, delivered bool, backoff time.Duration, dead bool, dueBy *time.Time) (Recorded, error) {
	h := newHandoff(ex)
	// The partner's reply can quote the message, and so can an error; the
	// ack code and outcome are metadata. A reply routed back in is sealed
	// again for the message column it is stored in.
	plainReply := a.Reply
	a.Reply = ex.Keys.Seal(store.ColReply, a.Reply)
	a.Error = ex.Keys.SealString(store.ColError, a.Error)
	a.DeadReason = ex.Keys.SealString(store.ColError, a.DeadReason)
	var res Recorded
	var n int
	count := func(r pgx.Row) error { return r.Scan(&n) }
	reply := delivered && a.ReplyTo != nil
	if reply {
		queueReplyLock(h, a.ReplyTo)
	}
	var act *jobs.Activation
	if delivered {
		h.b.Queue(`
			WITH w AS (
				UPDATE mefor_work SET status = 'done', attempts = attempts + 1, last_error = NULL,
					updated_at = clock_timestamp(), finished_at = clock_timestamp()
				WHERE id = $1 AND status = 'pending'
				RETURNING id, message_id, attempts
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, $2, attempts, $3, NULLIF($4, ''), $5 FROM w
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT message_id, 'delivered', id, $2, NULLIF($4, '') FROM w
			)
			SELECT count(*) FROM w`, row.ID, row.Destination, a.Outcome, a.AckCode, a.Reply).QueryRow(count)
		if reply {
			act = queueReply(h, row, a, plainReply)
		}
		h.finalize = append(h.finalize, row.MessageID)
	} else {
		h.b.Queue(`
			WITH w AS (
				UPDATE mefor_work SET attempts = attempts + 1, last_error = $6,
					next_attempt_at = clock_timestamp() + make_interval(secs => $7::float8),
					status = CASE WHEN $8 THEN 'dead' ELSE 'pending' END,
					finished_at = CASE WHEN $8 THEN clock_timestamp() END,
					updated_at = clock_timestamp()
				WHERE id = $1 AND status = 'pending' AND ($10::timestamptz IS NULL OR next_attempt_at <= $10)
				RETURNING id, message_id, attempts, status
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, $2, attempts, $3, NULLIF($4, ''), $5 FROM w
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT w.message_id, v.event, w.id, $2, v.detail
				FROM w CROSS JOIN LATERAL (VALUES
					(1, 'failed', format('attempt %s: %s', w.attempts, $6::text)),
					(2, 'dead', coalesce(NULLIF($9, ''), format('gave up after %s attempts', w.attempts)))
				) AS v(n, event, detail)
				WHERE v.n = 1 OR w.status = 'dead'
				ORDER BY v.n
			)
			SELECT count(*) FROM w`, row.ID, row.Destination, a.Outcome, a.AckCode, a.Reply,
			a.Error, backoff.Seconds(), dead, a.DeadReason, dueBy).QueryRow(count)
		if dead {
			h.finalize = append(h.finalize, row.MessageID)
		}
	}
	h.b.Queue(`SELECT EXISTS (SELECT 1 FROM mefor_work WHERE lane = $1 AND status = 'pending' AND cancel_requested_at IS NOT NULL)`,
		row.Lane).QueryRow(func(r pgx.Row) error { return r.Scan(&res.CancelsPending) })
	var ins jobs.Inserter
	if reply {
		ins = a.ReplyTo.Ins
	}
	if err := h.run(ctx, tx, ins, act); err != nil {
		return Recorded{}, err
	}
	res.Recorded = n == 1
	return res, nil
}

// CancelMarked cancels the rows of lane an operator marked for cancelling
// (store.CancelBatch does, when the lane's drainer is running), in ex's
// fenced transaction: the drainer calls it when RecordAttempt reports marks
// or it reads a marked row, before it sends anything else. It returns how
// many rows it cancelled.
func CancelMarked(ctx context.Context, tx pgx.Tx, ex Execution, lane string) (int, error) {
	if err := Fence(ctx, tx, ex); err != nil {
		return 0, err
	}
	n, err := store.CancelMarked(ctx, tx, lane)
	if err != nil {
		return 0, fmt.Errorf("cancel marked deliveries of lane %s: %w", lane, err)
	}
	return n, nil
}
