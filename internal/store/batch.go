package store

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
)

// The drainers' hand-offs are sent as one pgx batch each: the fence check,
// the lane locks, the set-based writes for every row served, the finalizer
// and the live-drainer checks travel in one round trip, executed in order
// inside the drainer's transaction. Each statement still gets its own
// snapshot (read committed), so the finalizer, queued after its lock,
// sees everything committed before the lock was granted. If the fence
// fails, the caller's transaction is rolled back with everything queued.

// Execution identifies one run of a drainer job for the fence check: River
// stamps attempted_at at every fetch, so it changes when the job is rescued
// and fetched again, even though a snooze gives the attempt number back.
type Execution struct {
	JobID       int64
	AttemptedAt time.Time
}

// NoFence is the execution of callers that are not drainers (operator
// tools, tests): their hand-offs skip the fence check. A drainer always
// passes its own execution.
var NoFence = Execution{}

// handoff accumulates one transaction's batch.
type handoff struct {
	b        pgx.Batch
	fenced   bool // set by the fence query when the execution is current
	finalize []int64
	// checks run after the batch, once the fence held; an error rolls the
	// hand-off back (transform state: state.go).
	checks []func() error
}

func newHandoff(ex Execution) *handoff {
	h := &handoff{}
	if ex == NoFence {
		h.fenced = true
		return h
	}
	h.b.Queue(fenceSQL, ex.JobID, ex.AttemptedAt).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			h.fenced = true
		}
		return rows.Err()
	})
	return h
}

// deadLetter queues dead-lettering of rows with their reasons.
func (h *handoff) deadLetter(rows []WorkRow, reasons []string) {
	if len(rows) == 0 {
		return
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
		h.finalize = append(h.finalize, r.MessageID)
	}
	h.b.Queue(`
		WITH u AS (SELECT * FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS u(id, reason, n)),
		w AS (
			UPDATE mefor_work w SET status = 'dead', last_error = u.reason,
				updated_at = clock_timestamp(), finished_at = clock_timestamp()
			FROM u WHERE w.id = u.id AND w.status = 'pending'
			RETURNING w.id, w.message_id, w.destination, u.reason, u.n
		)
		INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
		SELECT message_id, 'dead', id, destination, reason FROM w ORDER BY n`, ids, reasons)
}

// run sends the batch, checks the fence, finalizes and activates lanes.
func (h *handoff) run(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, act *jobs.Activation) error {
	if len(h.finalize) > 0 {
		queueFinalize(&h.b, h.finalize)
	}
	if err := tx.SendBatch(ctx, &h.b).Close(); err != nil {
		return err
	}
	if !h.fenced {
		return ErrFenced
	}
	for _, check := range h.checks {
		if err := check(); err != nil {
			return err
		}
	}
	if act != nil && ins != nil {
		return act.Finish(ctx, tx, ins)
	}
	return nil
}

// queueFinalize queues FinalizeMany's two statements onto a batch.
func queueFinalize(b *pgx.Batch, messageIDs []int64) {
	ids, keys := finalizeKeys(messageIDs)
	b.Queue(finalizeLockSQL, finalizeLockClass, keys)
	b.Queue(finalizeSQL, ids)
}

// finalizeKeys sorts and dedups message ids and folds each into the lock's
// int4 key space; a collision only makes two messages share a lock.
func finalizeKeys(messageIDs []int64) (ids, keys []int64) {
	ids = slices.Clone(messageIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	keys = make([]int64, len(ids))
	for i, id := range ids {
		keys[i] = int64(int32(id))
	}
	return ids, keys
}

// finalizeLockSQL takes the per-message locks in the order of $2.
const finalizeLockSQL = `SELECT pg_advisory_xact_lock($1, k::int4) FROM unnest($2::bigint[]) WITH ORDINALITY AS u(k, n) ORDER BY n`

// finalizeSQL derives the disposition of messages $1 from all their rows:
// nothing while any row is pending; any dead row → error; else any outbound
// row → processed; else a routed message → filtered.
const finalizeSQL = `
	WITH r AS (
		SELECT message_id,
			bool_or(status = 'pending')  AS any_pending,
			bool_or(status = 'dead')     AS any_dead,
			bool_or(stage = 'outbound')  AS any_outbound,
			min(last_error) FILTER (WHERE status = 'dead') AS dead_reason
		FROM mefor_work WHERE message_id = ANY($1::bigint[])
		GROUP BY message_id
	)
	UPDATE mefor_message m SET
		status = CASE
			WHEN r.any_dead THEN 'error'
			WHEN r.any_outbound THEN 'processed'
			ELSE 'filtered'
		END,
		error = CASE WHEN r.any_dead THEN 'dead-lettered: ' || coalesce(r.dead_reason, 'unknown reason') ELSE m.error END,
		updated_at = clock_timestamp()
	FROM r
	WHERE m.id = r.message_id
	  AND NOT r.any_pending
	  AND (r.any_dead OR r.any_outbound OR m.status = 'routed')`

// RouteDecision is what the router chose for one ingress row: the routes
// that matched (none: unrouted), or a reason to dead-letter it.
type RouteDecision struct {
	Outs       []RoutedOut
	DeadReason string
}

// RouteBatch hands a batch of ingress rows of one channel off: consumes them,
// writes one routed row per matched route (in row order, so the routed lane
// keeps the ingress order), sets routed/unrouted, records the events and
// activates the routed lane.
func RouteBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []WorkRow, decisions []RouteDecision) error {
	h := newHandoff(ex)
	var (
		dead        []WorkRow
		deadReasons []string
		consumed    []int64
		// routed rows to insert
		rMsg                []int64
		rRoute, rHandler    []string
		statusIDs           []int64
		statuses            []string
		evMsg, evWork       []int64
		evName, evDetail    []string
		channel, routedLane string
	)
	for i, row := range rows {
		d := decisions[i]
		if d.DeadReason != "" {
			dead = append(dead, row)
			deadReasons = append(deadReasons, d.DeadReason)
			continue
		}
		channel = row.Channel
		consumed = append(consumed, row.ID)
		statusIDs = append(statusIDs, row.MessageID)
		if len(d.Outs) == 0 {
			statuses = append(statuses, StatusUnrouted)
			evMsg, evWork = append(evMsg, row.MessageID), append(evWork, row.ID)
			evName, evDetail = append(evName, EventUnrouted), append(evDetail, "no route matched")
			continue
		}
		statuses = append(statuses, StatusRouted)
		detail := ""
		for j, o := range d.Outs {
			rMsg = append(rMsg, row.MessageID)
			rRoute, rHandler = append(rRoute, o.Route), append(rHandler, o.Handler)
			if j > 0 {
				detail += ", "
			}
			detail += o.Route
		}
		evMsg, evWork = append(evMsg, row.MessageID), append(evWork, row.ID)
		evName, evDetail = append(evName, EventRouted), append(evDetail, detail)
	}

	var act *jobs.Activation
	if len(rMsg) > 0 {
		routedLane = jobs.RoutedLane(channel)
		jobs.QueueLocks(&h.b, []string{routedLane})
	}
	h.deadLetter(dead, deadReasons)
	if len(consumed) > 0 {
		h.b.Queue(`
			UPDATE mefor_work SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
			WHERE id = ANY($1::bigint[]) AND status = 'pending'`, consumed)
		h.b.Queue(`
			UPDATE mefor_message m SET status = u.status, updated_at = clock_timestamp()
			FROM unnest($1::bigint[], $2::text[]) AS u(id, status) WHERE m.id = u.id`, statusIDs, statuses)
		queueEvents(&h.b, evMsg, evWork, evName, evDetail, nil)
	}
	if len(rMsg) > 0 {
		h.b.Queue(`
			INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler)
			SELECT m, 'routed', $4, $5, r, h
			FROM unnest($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS u(m, r, h, n)
			ORDER BY n`, rMsg, rRoute, rHandler, routedLane, channel)
		act = jobs.QueueActivation(&h.b, []string{routedLane})
	}
	return h.run(ctx, tx, ins, act)
}

// TransformDecision is what a handler produced for one routed row: the
// deliveries (none: filtered), or a reason to dead-letter the row.
type TransformDecision struct {
	Outs       []OutboundOut
	DeadReason string
	// State is what the row's transform read and wrote of transform state
	// (nil: nothing). The writes of a row that is dead-lettered are not
	// applied; its reads are still checked. See state.go.
	State *state.Change
}

// TransformBatch hands a batch of routed rows off: consumes them, writes one
// outbound row per delivery (in row order), records the events, finalizes
// the messages and activates every destination lane written.
func TransformBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []WorkRow, decisions []TransformDecision) error {
	h := newHandoff(ex)
	var (
		dead                    []WorkRow
		deadReasons             []string
		consumed                []int64
		oMsg                    []int64
		oLane, oChan, oRoute    []string
		oHandler, oDest         []string
		oPayload                [][]byte
		evMsg, evWork           []int64
		evName, evDetail, evDst []string
		lanes                   []string
	)
	for i, row := range rows {
		d := decisions[i]
		if d.DeadReason != "" {
			dead = append(dead, row)
			deadReasons = append(deadReasons, d.DeadReason)
			continue
		}
		consumed = append(consumed, row.ID)
		h.finalize = append(h.finalize, row.MessageID)
		for _, o := range d.Outs {
			oMsg = append(oMsg, row.MessageID)
			oLane, oChan, oRoute = append(oLane, o.Lane), append(oChan, row.Channel), append(oRoute, row.Route)
			oHandler, oDest, oPayload = append(oHandler, row.Handler), append(oDest, o.Destination), append(oPayload, o.Payload)
			lanes = append(lanes, o.Lane)
		}
		ev := EventTransformed
		if len(d.Outs) == 0 {
			ev = EventFiltered
		}
		evMsg, evWork, evName, evDetail, evDst = append(evMsg, row.MessageID), append(evWork, row.ID),
			append(evName, ev), append(evDetail, row.Handler), append(evDst, "")
	}

	// Lanes before message locks: the order every writer follows.
	jobs.QueueLocks(&h.b, lanes)
	h.deadLetter(dead, deadReasons)
	var act *jobs.Activation
	if len(consumed) > 0 {
		h.b.Queue(`
			UPDATE mefor_work SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
			WHERE id = ANY($1::bigint[]) AND status = 'pending'`, consumed)
		queueEvents(&h.b, evMsg, evWork, evName, evDetail, evDst)
	}
	queueState(h, rows, decisions)
	if len(oMsg) > 0 {
		h.b.Queue(`
			INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, payload)
			SELECT m, 'outbound', l, c, r, hd, d, p
			FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[])
				WITH ORDINALITY AS u(m, l, c, r, hd, d, p, n)
			ORDER BY n`, oMsg, oLane, oChan, oRoute, oHandler, oDest, oPayload)
		act = jobs.QueueActivation(&h.b, lanes)
	}
	return h.run(ctx, tx, ins, act)
}

func queueEvents(b *pgx.Batch, msg, work []int64, name, detail, dest []string) {
	if len(msg) == 0 {
		return
	}
	if dest == nil {
		dest = make([]string, len(msg))
	}
	b.Queue(`
		INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
		SELECT m, e, w, NULLIF(d, ''), NULLIF(x, '')
		FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[]) WITH ORDINALITY AS u(m, e, w, d, x, n)
		ORDER BY n`, msg, name, work, dest, detail)
}

// RecordAttempt records one delivery attempt of row in one round trip: the
// fence, the row (done; or its attempt, error and next attempt; or dead),
// the partner's reply, the events and, when the row ended, the finalizer.
// It returns false when the row was no longer pending (cancelled meanwhile).
func RecordAttempt(ctx context.Context, tx pgx.Tx, ex Execution, row WorkRow, a Attempt, delivered bool, backoff time.Duration, dead bool) (bool, error) {
	h := newHandoff(ex)
	var n int
	count := func(r pgx.Row) error { return r.Scan(&n) }
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
		h.finalize = append(h.finalize, row.MessageID)
	} else {
		h.b.Queue(`
			WITH w AS (
				UPDATE mefor_work SET attempts = attempts + 1, last_error = $6,
					next_attempt_at = clock_timestamp() + make_interval(secs => $7::float8),
					status = CASE WHEN $8 THEN 'dead' ELSE 'pending' END,
					finished_at = CASE WHEN $8 THEN clock_timestamp() END,
					updated_at = clock_timestamp()
				WHERE id = $1 AND status = 'pending'
				RETURNING id, message_id, attempts, status
			), r AS (
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				SELECT message_id, id, $2, attempts, $3, NULLIF($4, ''), $5 FROM w
			), e AS (
				INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
				SELECT w.message_id, v.event, w.id, $2, v.detail
				FROM w CROSS JOIN LATERAL (VALUES
					(1, 'failed', format('attempt %s: %s', w.attempts, $6::text)),
					(2, 'dead', format('gave up after %s attempts', w.attempts))
				) AS v(n, event, detail)
				WHERE v.n = 1 OR w.status = 'dead'
				ORDER BY v.n
			)
			SELECT count(*) FROM w`, row.ID, row.Destination, a.Outcome, a.AckCode, a.Reply,
			a.Error, backoff.Seconds(), dead).QueryRow(count)
		if dead {
			h.finalize = append(h.finalize, row.MessageID)
		}
	}
	if err := h.run(ctx, tx, nil, nil); err != nil {
		return false, err
	}
	return n == 1, nil
}
