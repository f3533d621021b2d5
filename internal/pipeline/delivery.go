package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	return record(ctx, tx, prepareRecord(ex, []Outcome{{Row: row, Attempt: a, Delivered: delivered, Backoff: backoff, Dead: dead}}, nil))
}

// RecordAttempts records the outcomes of several sends of one lane, in send
// order, in one round trip, as RecordAttempt records one: the fence once,
// every delivered row in one statement, each reply with the record of its
// own delivery, the failed attempts after the deliveries, one cancel probe
// and one finalizer. A drainer gathers a window of sends this way
// (config.RecordBatch); a failure ends its window, so a failed outcome is
// the last one. A superseded execution records none of them.
func RecordAttempts(ctx context.Context, tx pgx.Tx, ex Execution, outs []Outcome) (Recorded, error) {
	return record(ctx, tx, PrepareRecord(ex, outs))
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
	return record(ctx, tx, prepareRecord(ex, []Outcome{{Row: row, Attempt: a, Dead: dead}}, diedAt))
}

// record sends h, a record alone, and returns what it recorded.
func record(ctx context.Context, tx pgx.Tx, h *Handoff) (Recorded, error) {
	if len(h.rec.ids) == 0 {
		return Recorded{Recorded: true}, nil
	}
	if err := RunHandoffs(ctx, tx, h.replyIns, h); err != nil {
		return Recorded{}, err
	}
	return h.Recorded(), nil
}

// PrepareRecord prepares RecordAttempts's record of outs as a hand-off, to
// be sent by RunHandoffs alone or, when it is Shareable, with other
// drainers' hand-offs and records; Recorded then says what it recorded.
func PrepareRecord(ex Execution, outs []Outcome) *Handoff {
	return prepareRecord(ex, outs, nil)
}

// recordArgs are one lane's outcomes: the delivered rows, for the one
// statement that records every participant's, and the rest, each queued
// with its own statement.
type recordArgs struct {
	lane string
	// ids are every outcome's row, for the cancel probe to leave out.
	ids               []int64
	dID               []int64
	dDest, dOut, dAck []string
	dBody             [][]byte
	replies           []pendingReply
	failed            []failedRecord
	dueBy             *time.Time
	// res is what the last RunHandoffs that carried them recorded.
	res Recorded
}

type pendingReply struct {
	row   Row
	a     Attempt // sealed
	plain []byte
	// id is the reply message's id, drawn ahead when its body is sealed
	// (bound to it); 0 lets the insert draw it.
	id int64
}

type failedRecord struct {
	o Outcome
	a Attempt // sealed
}

// prepareRecord prepares the record of outs. dueBy, for a failed attempt,
// records it only if the row was due by then.
func prepareRecord(ex Execution, outs []Outcome, dueBy *time.Time) *Handoff {
	h := &Handoff{ex: ex, rec: &recordArgs{dueBy: dueBy}}
	if len(outs) == 0 {
		return h
	}
	r := h.rec
	r.lane = outs[0].Row.Lane
	var routes []*ReplyRoute
	for _, o := range outs {
		a := o.Attempt
		// The partner's reply can quote the message, and so can an error;
		// the ack code and outcome are metadata. A reply routed back in is
		// sealed again for the message column it is stored in.
		plain := a.Reply
		at := MessageRow(o.Row.MessageID)
		a.Reply = ex.Keys.Seal(ColReply, at, a.Reply)
		a.Error = ex.Keys.SealString(ColError, at, a.Error)
		a.DeadReason = ex.Keys.SealString(ColError, at, a.DeadReason)
		r.ids = append(r.ids, o.Row.ID)
		if !o.Delivered {
			r.failed = append(r.failed, failedRecord{o: o, a: a})
			if o.Dead {
				h.finalize = append(h.finalize, o.Row.MessageID)
			}
			continue
		}
		r.dID, r.dDest = append(r.dID, o.Row.ID), append(r.dDest, o.Row.Destination)
		r.dOut, r.dAck, r.dBody = append(r.dOut, a.Outcome), append(r.dAck, a.AckCode), append(r.dBody, a.Reply)
		h.finalize = append(h.finalize, o.Row.MessageID)
		if a.ReplyTo != nil {
			r.replies = append(r.replies, pendingReply{row: o.Row, a: a, plain: plain})
			routes = append(routes, a.ReplyTo)
			if h.replyIns == nil {
				h.replyIns = a.ReplyTo.Ins
			}
		}
	}
	// The reply channels' ingress lanes are locked with the lanes of the
	// batch, before any work row is written.
	h.lanes = replyLanes(routes)
	return h
}

// Recorded is what the last RunHandoffs that carried h recorded of its
// outcomes (h from PrepareRecord).
func (h *Handoff) Recorded() Recorded {
	if h.rec == nil {
		return Recorded{}
	}
	res := h.rec.res
	res.Recorded = res.Rows == len(h.rec.ids)
	return res
}

// cancelProbe is the record statements' look for rows of lane (an SQL
// expression) marked for cancelling, other than the ones recorded ($2): an
// index probe that costs nothing while none are. Its snapshot is taken
// after the fence's lock was granted, so it sees every mark committed by a
// cancel that waited on that lock.
func cancelProbe(lane string) string {
	return `EXISTS (SELECT 1 FROM mefor_work x WHERE x.lane = ` + lane + ` AND x.status = 'pending'
		AND x.cancel_requested_at IS NOT NULL AND x.id <> ALL($2::bigint[]))`
}

// queueRecords queues the records of rs, the records of one batch: one
// statement for every delivered row of all of them, which answers, for
// each record, how many of its rows it found pending and whether rows of
// its lane are marked for cancelling (cancelProbe); then, for a record
// alone, its replies and its failed attempts.
func queueRecords(b *handoff, rs []*recordArgs) {
	var (
		ids, dID          []int64
		dK                []int64
		dDest, dOut, dAck []string
		dBody             [][]byte
		lanes             []string
		of                []*recordArgs // by participant, from 1
	)
	for _, r := range rs {
		r.res = Recorded{}
		ids = append(ids, r.ids...)
		if len(r.dID) == 0 {
			continue
		}
		of = append(of, r)
		lanes = append(lanes, r.lane)
		for range r.dID {
			dK = append(dK, int64(len(of)))
		}
		dID, dDest = append(dID, r.dID...), append(dDest, r.dDest...)
		dOut, dAck, dBody = append(dOut, r.dOut...), append(dAck, r.dAck...), append(dBody, r.dBody...)
	}
	if len(dID) > 0 {
		b.b.Queue(`
			WITH u AS (
				SELECT * FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::bigint[])
					WITH ORDINALITY AS u(id, destination, outcome, ack_code, body, k, n)
			), w AS (
				UPDATE mefor_work w SET status = 'done', attempts = w.attempts + 1, last_error = NULL,
					updated_at = clock_timestamp(), finished_at = clock_timestamp()
				FROM u WHERE w.id = u.id AND w.status = `+PendingByID+`
				RETURNING w.id, w.message_id, w.attempts, u.destination, u.outcome, u.ack_code, u.body, u.k, u.n
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, destination, attempts, outcome, NULLIF(ack_code, ''), body FROM w ORDER BY n
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT message_id, 'delivered', id, destination, NULLIF(ack_code, '') FROM w ORDER BY n
			)
			SELECT p.k, (SELECT count(*) FROM w WHERE w.k = p.k), `+cancelProbe("p.lane")+`
			FROM unnest($1::text[]) WITH ORDINALITY AS p(lane, k)`,
			lanes, ids, dID, dDest, dOut, dAck, dBody, dK).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k int64
				var n int
				var cancels bool
				if err := rows.Scan(&k, &n, &cancels); err != nil {
					return err
				}
				if k < 1 || int(k) > len(of) {
					return fmt.Errorf("record statement answered for participant %d of %d", k, len(of))
				}
				r := of[k-1]
				r.res.Rows += n
				r.res.CancelsPending = r.res.CancelsPending || cancels
			}
			return rows.Err()
		})
	}
	for _, r := range rs {
		for _, p := range r.replies {
			queueReply(b, p.row, p.a, p.plain, p.id)
		}
		for _, f := range r.failed {
			queueFailed(b, r, f)
		}
	}
}

// queueFailed queues the record of a failed attempt of r's lane.
func queueFailed(b *handoff, r *recordArgs, f failedRecord) {
	o, a := f.o, f.a
	b.b.Queue(`
		WITH w AS (
			UPDATE mefor_work SET attempts = attempts + 1, last_error = $8,
				next_attempt_at = clock_timestamp() + make_interval(secs => $9::float8),
				status = CASE WHEN $10 THEN 'dead' ELSE 'pending' END,
				finished_at = CASE WHEN $10 THEN clock_timestamp() END,
				updated_at = clock_timestamp()
			WHERE id = $3 AND status = `+PendingByID+` AND ($12::timestamptz IS NULL OR next_attempt_at <= $12)
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
		SELECT count(*), `+cancelProbe("$1")+` FROM w`,
		r.lane, r.ids, o.Row.ID, o.Row.Destination, a.Outcome, a.AckCode, a.Reply,
		a.Error, o.Backoff.Seconds(), o.Dead, a.DeadReason, r.dueBy).QueryRow(func(row pgx.Row) error {
		var n int
		var cancels bool
		if err := row.Scan(&n, &cancels); err != nil {
			return err
		}
		r.res.Rows += n
		r.res.CancelsPending = r.res.CancelsPending || cancels
		return nil
	})
}

// CancelMarked cancels the rows of lane an operator marked for cancelling
// (CancelBatch does, when the lane's drainer is running), in ex's
// fenced transaction: the drainer calls it when RecordAttempt reports marks
// or it reads a marked row, before it sends anything else. It returns how
// many rows it cancelled.
func CancelMarked(ctx context.Context, tx pgx.Tx, ex Execution, lane string) (int, error) {
	if err := Fence(ctx, tx, ex); err != nil {
		return 0, err
	}
	n, err := cancelMarked(ctx, tx, lane)
	if err != nil {
		return 0, fmt.Errorf("cancel marked deliveries of lane %s: %w", lane, err)
	}
	return n, nil
}
