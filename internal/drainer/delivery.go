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

// Recorded is what RecordAttempt and RecordAttempts found.
type Recorded struct {
	// Recorded is false when a row was no longer pending.
	Recorded bool
	// Rows is how many of the outcomes found their row pending and were
	// recorded.
	Rows int
	// CancelsPending is true when rows of the lane are marked for
	// cancelling (an operator cancelled them while this drainer was
	// running): the drainer must resolve them (CancelMarked) before it
	// sends anything else. A marked row it just sent is recorded as
	// delivered all the same.
	CancelsPending bool
}

// Outcome is one send of a lane's row, to be recorded.
type Outcome struct {
	Row       Row
	Attempt   Attempt
	Delivered bool
	// Backoff and Dead apply to a failed attempt: the wait before the
	// next one, or the end of the row.
	Backoff time.Duration
	Dead    bool
}

// RecordAttempt records one delivery attempt of row in one round trip: the
// fence, the row (done; or its attempt, error and next attempt; or dead),
// the partner's reply, the events and, when the row ended, the finalizer.
// A delivered attempt with a.ReplyTo also stores the reply as a message of
// that channel, in the same transaction (reply.go).
// The same round trip asks whether rows of the lane are marked for
// cancelling, an index probe that costs nothing while none are.
func RecordAttempt(ctx context.Context, tx pgx.Tx, ex Execution, row Row, a Attempt, delivered bool, backoff time.Duration, dead bool) (Recorded, error) {
	return recordAttempts(ctx, tx, ex, []Outcome{{Row: row, Attempt: a, Delivered: delivered, Backoff: backoff, Dead: dead}}, nil)
}

// RecordAttempts records the outcomes of several sends of one lane, in send
// order, in one round trip, as RecordAttempt records one: the fence once,
// every delivered row in one statement, each reply with the record of its
// own delivery, the failed attempts after the deliveries, one cancel probe
// and one finalizer. A drainer gathers a window of sends this way
// (config.RecordBatch); a failure ends its window, so a failed outcome is
// the last one. A superseded execution records none of them.
func RecordAttempts(ctx context.Context, tx pgx.Tx, ex Execution, outs []Outcome) (Recorded, error) {
	return recordAttempts(ctx, tx, ex, outs, nil)
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
	return recordAttempts(ctx, tx, ex, []Outcome{{Row: row, Attempt: a, Dead: dead}}, diedAt)
}

// recordAttempts queues the records of outs after the fence. dueBy, for a
// failed attempt, records it only if the row was due by then.
func recordAttempts(ctx context.Context, tx pgx.Tx, ex Execution, outs []Outcome, dueBy *time.Time) (Recorded, error) {
	if len(outs) == 0 {
		return Recorded{Recorded: true}, nil
	}
	h := newHandoff(ex)
	lane := outs[0].Row.Lane
	var (
		// delivered rows, for the one statement that records them all
		dID               []int64
		dDest, dOut, dAck []string
		dBody             [][]byte
		replies           []int // indexes into outs
		routes            []*ReplyRoute
		sealed            = make([]Attempt, len(outs))
		plainReplies      = make([][]byte, len(outs))
		ids               = make([]int64, len(outs))
	)
	for i, o := range outs {
		a := o.Attempt
		// The partner's reply can quote the message, and so can an error;
		// the ack code and outcome are metadata. A reply routed back in is
		// sealed again for the message column it is stored in.
		plainReplies[i] = a.Reply
		a.Reply = ex.Keys.Seal(store.ColReply, a.Reply)
		a.Error = ex.Keys.SealString(store.ColError, a.Error)
		a.DeadReason = ex.Keys.SealString(store.ColError, a.DeadReason)
		sealed[i] = a
		ids[i] = o.Row.ID
		if !o.Delivered {
			continue
		}
		dID, dDest = append(dID, o.Row.ID), append(dDest, o.Row.Destination)
		dOut, dAck, dBody = append(dOut, a.Outcome), append(dAck, a.AckCode), append(dBody, a.Reply)
		h.finalize = append(h.finalize, o.Row.MessageID)
		if a.ReplyTo != nil {
			replies = append(replies, i)
			routes = append(routes, a.ReplyTo)
		}
	}
	queueReplyLocks(h, routes)

	var res Recorded
	scan := func(r pgx.Row) error {
		var n int
		var cancels bool
		if err := r.Scan(&n, &cancels); err != nil {
			return err
		}
		res.Rows += n
		res.CancelsPending = res.CancelsPending || cancels
		return nil
	}
	// Each record statement also probes for rows of the lane marked for
	// cancelling, other than the ones it records: its snapshot is taken
	// after the fence's lock was granted, so it sees every mark committed
	// by a cancel that waited on that lock.
	const cancelProbe = `EXISTS (SELECT 1 FROM mefor_work WHERE lane = $1 AND status = 'pending'
		AND cancel_requested_at IS NOT NULL AND id <> ALL($2::bigint[]))`
	if len(dID) > 0 {
		h.b.Queue(`
			WITH u AS (
				SELECT * FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::bytea[])
					WITH ORDINALITY AS u(id, destination, outcome, ack_code, body, n)
			), w AS (
				UPDATE mefor_work w SET status = 'done', attempts = w.attempts + 1, last_error = NULL,
					updated_at = clock_timestamp(), finished_at = clock_timestamp()
				FROM u WHERE w.id = u.id AND w.status = `+store.PendingByID+`
				RETURNING w.id, w.message_id, w.attempts, u.destination, u.outcome, u.ack_code, u.body, u.n
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, destination, attempts, outcome, NULLIF(ack_code, ''), body FROM w ORDER BY n
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT message_id, 'delivered', id, destination, NULLIF(ack_code, '') FROM w ORDER BY n
			)
			SELECT count(*), `+cancelProbe+` FROM w`,
			lane, ids, dID, dDest, dOut, dAck, dBody).QueryRow(scan)
	}
	var reached []string
	for _, i := range replies {
		if l := queueReply(h, outs[i].Row, sealed[i], plainReplies[i]); l != "" {
			reached = append(reached, l)
		}
	}
	for i, o := range outs {
		if o.Delivered {
			continue
		}
		a := sealed[i]
		h.b.Queue(`
			WITH w AS (
				UPDATE mefor_work SET attempts = attempts + 1, last_error = $8,
					next_attempt_at = clock_timestamp() + make_interval(secs => $9::float8),
					status = CASE WHEN $10 THEN 'dead' ELSE 'pending' END,
					finished_at = CASE WHEN $10 THEN clock_timestamp() END,
					updated_at = clock_timestamp()
				WHERE id = $3 AND status = `+store.PendingByID+` AND ($12::timestamptz IS NULL OR next_attempt_at <= $12)
				RETURNING id, message_id, attempts, status
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, $4, attempts, $5, NULLIF($6, ''), $7 FROM w
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT w.message_id, v.event, w.id, $4, v.detail
				FROM w CROSS JOIN LATERAL (VALUES
					(1, 'failed', format('attempt %s: %s', w.attempts, $8::text)),
					(2, 'dead', coalesce(NULLIF($11, ''), format('gave up after %s attempts', w.attempts)))
				) AS v(n, event, detail)
				WHERE v.n = 1 OR w.status = 'dead'
				ORDER BY v.n
			)
			SELECT count(*), `+cancelProbe+` FROM w`, lane, ids, o.Row.ID, o.Row.Destination, a.Outcome, a.AckCode, a.Reply,
			a.Error, o.Backoff.Seconds(), o.Dead, a.DeadReason, dueBy).QueryRow(scan)
		if o.Dead {
			h.finalize = append(h.finalize, o.Row.MessageID)
		}
	}
	var act *jobs.Activation
	var ins jobs.Inserter
	if len(reached) > 0 {
		act = jobs.QueueActivation(&h.b, reached)
		for _, i := range replies {
			if outs[i].Attempt.ReplyTo.Ins != nil {
				ins = outs[i].Attempt.ReplyTo.Ins
				break
			}
		}
	}
	if err := h.run(ctx, tx, ins, act); err != nil {
		return Recorded{}, err
	}
	res.Recorded = res.Rows == len(outs)
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
