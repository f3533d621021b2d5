package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/jobs"
)

// The operator writes: replay one message, replay dead letters, cancel
// pending deliveries. Each runs in the caller's transaction and keeps the lock
// order every pipeline path uses: lane locks (jobs.LockLanes) first, then the
// work rows, then the messages' finalize locks in id order. A row that re-enters its lane draws a
// fresh seq under the lane lock, so it goes to the back, and the lane is
// activated in the same transaction so a drainer serves it.

// ErrBodyPurged means retention removed the message's body, so there is
// nothing left to process or send again.
var ErrBodyPurged = errors.New("message body was purged by retention")

// Replay modes.
const (
	// ReplayRecover re-queues a message's dead and pending rows.
	ReplayRecover = "recover"
	// ReplayResend re-sends a message's delivered (done outbound) rows.
	ReplayResend = "resend"
)

// ReplayResult is what ReplayMessage did.
type ReplayResult struct {
	MessageID int64 `json:"message_id"`
	// Mode is ReplayRecover or ReplayResend; empty when there was nothing
	// to replay.
	Mode string `json:"mode,omitempty"`
	// Rows is how many rows were re-queued.
	Rows int `json:"rows"`
	// Status is the message's status afterwards.
	Status string `json:"status"`
	// Expedited lists lanes in which a pending row that was waiting out a
	// backoff is now due: their snoozed drainers are worth waking.
	Expedited []string `json:"-"`
}

// ReplayMessage re-queues one message:
//
//   - if it has dead or pending rows (any stage), those are re-queued with
//     attempts reset, error cleared and due now. Dead rows go to the back of
//     their lane; pending rows are still in their lane and keep their place,
//     so a replay never lets a message overtake the ones queued behind it.
//   - otherwise its delivered (done outbound) rows are re-sent, each at the
//     back of its lane. Done ingress and routed rows are history of stages
//     already handed on: they are never re-run.
//
// Cancelled rows are never touched. When rows were re-queued the message goes
// back to received (an ingress row is pending again) or routed, its error is
// cleared and a replayed event is recorded. ErrNotFound for an unknown id,
// ErrBodyPurged when retention removed the body.
func ReplayMessage(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, messageID int64) (ReplayResult, error) {
	res := ReplayResult{MessageID: messageID}
	var purged bool
	err := tx.QueryRow(ctx, `
		SELECT status, body_purged_at IS NOT NULL FROM mefor_message WHERE id = $1`,
		messageID).Scan(&res.Status, &purged)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("message %d: %w", messageID, ErrNotFound)
	}
	if err != nil {
		return res, fmt.Errorf("read message %d: %w", messageID, err)
	}

	type cand struct {
		id     int64
		lane   string
		status string
	}
	read := func(where string) ([]cand, error) {
		rows, err := tx.Query(ctx, `SELECT id, lane, status FROM mefor_work WHERE message_id = $1 AND `+where+` ORDER BY id`, messageID)
		if err != nil {
			return nil, fmt.Errorf("read stage rows of message %d: %w", messageID, err)
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
			var c cand
			return c, r.Scan(&c.id, &c.lane, &c.status)
		})
	}
	cands, err := read(`status IN ('dead', 'pending')`)
	if err != nil {
		return res, err
	}
	res.Mode = ReplayRecover
	if len(cands) == 0 {
		if cands, err = read(`status = 'done' AND stage = 'outbound'`); err != nil {
			return res, err
		}
		res.Mode = ReplayResend
	}
	if len(cands) == 0 {
		res.Mode = ""
		return res, nil
	}
	if purged {
		return res, fmt.Errorf("message %d: %w", messageID, ErrBodyPurged)
	}

	var lanes []string
	var pendingIDs, requeueIDs []int64
	for _, c := range cands {
		lanes = append(lanes, c.lane)
		if c.status == WorkPending {
			pendingIDs = append(pendingIDs, c.id)
		} else {
			requeueIDs = append(requeueIDs, c.id)
		}
	}
	if err := jobs.LockLanes(ctx, tx, lanes); err != nil {
		return res, err
	}
	if err := lockRows(ctx, tx, append(slices.Clone(pendingIDs), requeueIDs...)); err != nil {
		return res, err
	}
	if err := lockMessages(ctx, tx, []int64{messageID}); err != nil {
		return res, err
	}
	// Retention may have purged the body after the first read: it takes
	// the same row and finalize locks, so under them the answer is final.
	if err := tx.QueryRow(ctx, `
		SELECT body_purged_at IS NOT NULL FROM mefor_message WHERE id = $1`, messageID).Scan(&purged); err != nil {
		return res, fmt.Errorf("read message %d: %w", messageID, err)
	}
	if purged {
		return res, fmt.Errorf("message %d: %w", messageID, ErrBodyPurged)
	}

	// Pending rows: reset in place. Each row is re-checked under its row
	// lock, so one a drainer finished meanwhile is left alone.
	rows, err := tx.Query(ctx, `
		WITH old AS (
			SELECT id, next_attempt_at > clock_timestamp() AS waiting
			FROM mefor_work WHERE id = ANY($1) AND status = `+PendingByID+`
			FOR UPDATE
		)
		UPDATE mefor_work w SET attempts = 0, last_error = NULL, next_attempt_at = clock_timestamp(),
			updated_at = clock_timestamp()
		FROM old WHERE w.id = old.id
		RETURNING w.lane, old.waiting`, pendingIDs)
	if err != nil {
		return res, fmt.Errorf("reset pending rows of message %d: %w", messageID, err)
	}
	var lane string
	var waiting bool
	_, err = pgx.ForEachRow(rows, []any{&lane, &waiting}, func() error {
		res.Rows++
		if waiting && !slices.Contains(res.Expedited, lane) {
			res.Expedited = append(res.Expedited, lane)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("reset pending rows of message %d: %w", messageID, err)
	}

	from := []string{WorkDead}
	if res.Mode == ReplayResend {
		from = []string{WorkDone}
	}
	requeued, err := requeue(ctx, tx, requeueIDs, from)
	if err != nil {
		return res, err
	}
	res.Rows += len(requeued)
	if res.Rows == 0 {
		// Every candidate changed under us (a drainer finished it).
		res.Mode = ""
		return res, nil
	}
	if err := jobs.Activate(ctx, tx, ins, lanes); err != nil {
		return res, err
	}
	err = tx.QueryRow(ctx, `
		UPDATE mefor_message SET
			status = CASE WHEN EXISTS (
				SELECT 1 FROM mefor_work WHERE message_id = $1 AND stage = 'ingress' AND status = `+PendingByID+`)
				THEN 'received' ELSE 'routed' END,
			error = NULL, updated_at = clock_timestamp()
		WHERE id = $1
		RETURNING status`, messageID).Scan(&res.Status)
	if err != nil {
		return res, fmt.Errorf("mark message %d replayed: %w", messageID, err)
	}
	detail := fmt.Sprintf("re-queued %d row(s)", res.Rows)
	if res.Mode == ReplayResend {
		detail = fmt.Sprintf("re-sending %d delivered row(s)", res.Rows)
	}
	return res, AddEvent(ctx, tx, messageID, EventReplayed, 0, "", detail)
}

// requeuedRow is a row requeue put back into its lane.
type requeuedRow struct {
	id, messageID int64
	lane          string
	destination   string
}

// requeue puts rows that are in one of the from statuses back to pending at
// the back of their lanes: a fresh seq each (rows of one lane keep their
// relative order), attempts reset, due now. The caller holds the lanes'
// locks, so the seqs are larger than any row already in those lanes.
func requeue(ctx context.Context, tx pgx.Tx, ids []int64, from []string) ([]requeuedRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `
		WITH locked AS (
			SELECT id, lane, seq FROM mefor_work w
			WHERE id = ANY($1) AND status = ANY($2)
			  -- Nothing is left to send once retention purged the body.
			  AND NOT EXISTS (SELECT 1 FROM mefor_message m WHERE m.id = w.message_id AND m.body_purged_at IS NOT NULL)
			FOR UPDATE OF w
		), pick AS (
			SELECT id, row_number() OVER (ORDER BY lane, seq, id) AS rn FROM locked
		), fresh AS (
			SELECT v, row_number() OVER (ORDER BY v) AS rn
			FROM (SELECT nextval('mefor_work_seq') AS v FROM locked) s
		)
		UPDATE mefor_work w SET status = 'pending', seq = fresh.v, attempts = 0, last_error = NULL,
			next_attempt_at = clock_timestamp(), updated_at = clock_timestamp(), finished_at = NULL,
			cancel_requested_at = NULL
		FROM pick JOIN fresh USING (rn)
		WHERE w.id = pick.id
		RETURNING w.id, w.message_id, w.lane, coalesce(w.destination, '')`, ids, from)
	if err != nil {
		return nil, fmt.Errorf("re-queue %d row(s): %w", len(ids), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (requeuedRow, error) {
		var q requeuedRow
		return q, r.Scan(&q.id, &q.messageID, &q.lane, &q.destination)
	})
	if err != nil {
		return nil, fmt.Errorf("re-queue %d row(s): %w", len(ids), err)
	}
	return out, nil
}

// lockRows locks work rows in id order. The pipeline's lock order is lane
// locks, then work rows, then message finalize locks: a drainer recording a
// delivery holds its row while it finalizes, so taking a message's lock
// before its rows could deadlock with it.
func lockRows(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if _, err := tx.Exec(ctx, `
		SELECT id FROM mefor_work WHERE id IN (SELECT unnest($1::bigint[])) ORDER BY id FOR UPDATE`, ids); err != nil {
		return fmt.Errorf("lock %d work row(s): %w", len(ids), err)
	}
	return nil
}

// lockMessages takes the finalize locks of messages in id order (the
// finalizer's own lock), so a concurrent Finalize of the same message sees
// this transaction's rows only after it commits.
func lockMessages(ctx context.Context, tx pgx.Tx, ids []int64) error {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", finalizeLockClass, int32(id)); err != nil {
			return fmt.Errorf("lock message %d: %w", id, err)
		}
	}
	return nil
}

// MaxWorkID is the largest work row id so far: bulk operations stop there,
// so rows arriving while they run are not chased.
func MaxWorkID(ctx context.Context, q DBTX) (int64, error) {
	var id int64
	if err := q.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM mefor_work").Scan(&id); err != nil {
		return 0, fmt.Errorf("read last work row id: %w", err)
	}
	return id, nil
}

// CountDeadOutbound counts the dead outbound rows ReplayDeadBatch would
// re-queue, up to and including row id upTo.
func CountDeadOutbound(ctx context.Context, q DBTX, f DeadFilter, upTo int64) (int, error) {
	var n int
	err := q.QueryRow(ctx, `
		SELECT count(*) FROM mefor_work
		WHERE stage = 'outbound' AND status = 'dead' AND id <= $3
		  AND ($1 = '' OR channel = $1) AND ($2 = '' OR destination = $2)`,
		f.Channel, f.Destination, upTo).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead deliveries: %w", err)
	}
	return n, nil
}

// BatchResult is what one batch of a bulk operation did.
type BatchResult struct {
	// Seen is how many candidate rows the batch looked at; 0 means the
	// operation is complete.
	Seen int
	// Rows is how many rows it changed.
	Rows int
	// Skipped counts rows left alone because their body was purged.
	Skipped int
	// Messages is how many distinct messages it touched.
	Messages int
	// LastID is the cursor for the next batch.
	LastID int64
	// Lanes are the lanes it changed rows in.
	Lanes []string
	// Marked are the rows CancelBatch marked for their running drainer to
	// resolve instead of cancelling them.
	Marked []int64
}

// ReplayDeadBatch re-queues up to limit dead outbound rows matching f with
// after < id <= upTo, in id order, at the back of their lanes (outbound
// only, the dead-letter view's scope). Each affected message goes from
// error back to routed and gets a replayed event per row.
// Rows whose message body was purged are skipped: there is nothing to send.
func ReplayDeadBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, f DeadFilter, after, upTo int64, limit int) (BatchResult, error) {
	var res BatchResult
	rows, err := tx.Query(ctx, `
		SELECT w.id, w.lane, w.message_id, m.body_purged_at IS NOT NULL
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.stage = 'outbound' AND w.status = 'dead' AND w.id > $3 AND w.id <= $4
		  AND ($1 = '' OR w.channel = $1) AND ($2 = '' OR w.destination = $2)
		ORDER BY w.id
		LIMIT $5`, f.Channel, f.Destination, after, upTo, limit)
	if err != nil {
		return res, fmt.Errorf("find dead deliveries: %w", err)
	}
	var ids, msgs []int64
	var lanes []string
	var id, msg int64
	var lane string
	var purged bool
	_, err = pgx.ForEachRow(rows, []any{&id, &lane, &msg, &purged}, func() error {
		res.Seen++
		res.LastID = id
		if purged {
			res.Skipped++
			return nil
		}
		ids, msgs, lanes = append(ids, id), append(msgs, msg), append(lanes, lane)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("find dead deliveries: %w", err)
	}
	if len(ids) == 0 {
		return res, nil
	}
	if err := jobs.LockLanes(ctx, tx, lanes); err != nil {
		return res, err
	}
	if err := lockRows(ctx, tx, ids); err != nil {
		return res, err
	}
	if err := lockMessages(ctx, tx, msgs); err != nil {
		return res, err
	}
	requeued, err := requeue(ctx, tx, ids, []string{WorkDead})
	if err != nil {
		return res, err
	}
	if len(requeued) == 0 {
		return res, nil
	}
	var rq struct {
		work, msg []int64
		dest      []string
	}
	for _, r := range requeued {
		rq.work, rq.msg, rq.dest = append(rq.work, r.id), append(rq.msg, r.messageID), append(rq.dest, r.destination)
		if !slices.Contains(res.Lanes, r.lane) {
			res.Lanes = append(res.Lanes, r.lane)
		}
	}
	res.Rows = len(requeued)
	if err := jobs.Activate(ctx, tx, ins, res.Lanes); err != nil {
		return res, err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE mefor_message SET status = 'routed', error = NULL, updated_at = clock_timestamp()
		WHERE id = ANY($1) AND status = 'error'`, rq.msg); err != nil {
		return res, fmt.Errorf("mark replayed messages routed: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
		SELECT m, $4, w, NULLIF(d, ''), 'dead-letter replay'
		FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(m, w, d)`,
		rq.msg, rq.work, rq.dest, EventReplayed); err != nil {
		return res, fmt.Errorf("record replayed events: %w", err)
	}
	slices.Sort(rq.msg)
	res.Messages = len(slices.Compact(rq.msg))
	return res, nil
}

// CancelFilter selects the pending deliveries CancelBatch cancels.
type CancelFilter struct {
	Destination string // required
	Channel     string // empty: rows of every channel
	// Top cancels only the head of each lane of the destination whose head
	// has failed at least once (the rows blocking their lanes); with Channel
	// set, only heads of that channel. Healthy lanes are left alone.
	Top bool
}

// CancelBatch cancels up to limit pending outbound rows matching f with
// after < id <= upTo, records a cancelled event each and finalizes their
// messages (locked in id order). A row a drainer finished meanwhile is left
// as it is.
//
// A row whose lane has a running drainer is not cancelled but marked
// (BatchResult.Marked): that drainer may be sending it at this moment, and
// only it can tell. It resolves the marks in its next transaction: a row it
// has not sent is cancelled, a row it sent is recorded delivered with the
// partner's reply. Lanes whose drainer is not running have nobody holding
// their rows: their rows are cancelled at once. To tell the two apart the
// drainers' river_job rows are locked first, in id order, before the lane
// locks (the order a drainer takes them in: its fence, then a lane lock):
// while cancel holds a job row no execution of it can start (River's fetch
// skips locked rows) and none is inside a transaction, so a drainer never
// sees marks appear half-way through one of its hand-offs.
func CancelBatch(ctx context.Context, tx pgx.Tx, f CancelFilter, after, upTo int64, limit int) (BatchResult, error) {
	var res BatchResult
	if f.Destination == "" {
		return res, errors.New("cancel needs a destination")
	}
	var rows pgx.Rows
	var err error
	if f.Top {
		rows, err = tx.Query(ctx, `
			SELECT id, lane FROM (
				SELECT DISTINCT ON (lane) id, lane, channel, attempts FROM mefor_work
				WHERE stage = 'outbound' AND status = 'pending' AND destination = $1
				ORDER BY lane, seq
			) h
			WHERE attempts > 0 AND ($2 = '' OR channel = $2) AND id > $3 AND id <= $4
			ORDER BY id
			LIMIT $5`, f.Destination, f.Channel, after, upTo, limit)
	} else {
		// No index has a destination's pending rows in id order: with
		// current statistics the planner takes the primary key from the
		// cursor. Statistics that count no pending rows make it walk every
		// destination's pending rows at each batch; forcing the primary
		// key instead would make a first batch read the whole history
		// before the destination's oldest pending row.
		rows, err = tx.Query(ctx, `
			SELECT id, lane FROM mefor_work
			WHERE stage = 'outbound' AND status = 'pending' AND destination = $1
			  AND ($2 = '' OR channel = $2) AND id > $3 AND id <= $4
			ORDER BY id
			LIMIT $5`, f.Destination, f.Channel, after, upTo, limit)
	}
	if err != nil {
		return res, fmt.Errorf("find pending deliveries to %s: %w", f.Destination, err)
	}
	var ids []int64
	var laneOf []string
	var id int64
	var lane string
	_, err = pgx.ForEachRow(rows, []any{&id, &lane}, func() error {
		res.Seen++
		res.LastID = id
		ids, laneOf = append(ids, id), append(laneOf, lane)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("find pending deliveries to %s: %w", f.Destination, err)
	}
	if len(ids) == 0 {
		return res, nil
	}
	running, err := lockDrainers(ctx, tx, laneOf)
	if err != nil {
		return res, err
	}
	if err := jobs.LockLanes(ctx, tx, laneOf); err != nil {
		return res, err
	}
	if err := lockRows(ctx, tx, ids); err != nil {
		return res, err
	}
	var now, later []int64
	for i, id := range ids {
		if running[laneOf[i]] {
			later = append(later, id)
		} else {
			now = append(now, id)
		}
	}
	if len(later) > 0 {
		marked, err := tx.Query(ctx, `
			UPDATE mefor_work SET cancel_requested_at = clock_timestamp(), updated_at = clock_timestamp()
			WHERE id = ANY($1) AND status = `+PendingByID+`
			RETURNING id`, later)
		if err != nil {
			return res, fmt.Errorf("mark deliveries to %s for cancelling: %w", f.Destination, err)
		}
		if res.Marked, err = pgx.CollectRows(marked, pgx.RowTo[int64]); err != nil {
			return res, fmt.Errorf("mark deliveries to %s for cancelling: %w", f.Destination, err)
		}
	}
	c, err := cancelRows(ctx, tx, `id = ANY($1) AND status = `+PendingByID, now)
	if err != nil {
		return res, fmt.Errorf("cancel deliveries to %s: %w", f.Destination, err)
	}
	res.Rows, res.Messages, res.Lanes = c.Rows, c.Messages, c.Lanes
	return res, nil
}

// lockDrainers locks the river_job rows of the lanes' drainers in id order
// and reports which lanes have a running one. A drainer that is not running
// cannot start until tx ends. Callers take it before any lane lock.
func lockDrainers(ctx context.Context, tx pgx.Tx, lanes []string) (map[string]bool, error) {
	sorted := slices.Clone(lanes)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	rows, err := tx.Query(ctx, `
		SELECT l.name, j.state = 'running'
		FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = ANY($1)
		ORDER BY j.id
		FOR UPDATE OF j`, sorted)
	if err != nil {
		return nil, fmt.Errorf("lock drainers of %d lane(s): %w", len(sorted), err)
	}
	running := map[string]bool{}
	var lane string
	var run bool
	if _, err := pgx.ForEachRow(rows, []any{&lane, &run}, func() error {
		running[lane] = run
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock drainers of %d lane(s): %w", len(sorted), err)
	}
	return running, nil
}

// cancelRows cancels the rows of mefor_work matching where (with $1 = arg),
// which names them pending (by lane, as the pending indexes serve; by id,
// with PendingByID), records a cancelled event each and finalizes their
// messages.
// The caller holds the rows' lane locks or their drainer's fence.
func cancelRows(ctx context.Context, tx pgx.Tx, where string, arg any) (BatchResult, error) {
	var res BatchResult
	rows, err := tx.Query(ctx, `
		WITH c AS (
			SELECT id FROM mefor_work WHERE `+where+` ORDER BY id FOR UPDATE
		), w AS (
			UPDATE mefor_work w SET status = 'cancelled', updated_at = clock_timestamp(), finished_at = clock_timestamp()
			FROM c WHERE w.id = c.id
			RETURNING w.id, w.message_id, w.lane, coalesce(w.destination, '') AS destination
		), e AS (
			INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
			SELECT message_id, 'cancelled', id, NULLIF(destination, ''), 'cancelled by operator' FROM w
		)
		SELECT message_id, lane FROM w`, arg)
	if err != nil {
		return res, err
	}
	var msgs []int64
	var msg int64
	var lane string
	if _, err := pgx.ForEachRow(rows, []any{&msg, &lane}, func() error {
		res.Rows++
		msgs = append(msgs, msg)
		if !slices.Contains(res.Lanes, lane) {
			res.Lanes = append(res.Lanes, lane)
		}
		return nil
	}); err != nil {
		return res, err
	}
	if res.Rows == 0 {
		return res, nil
	}
	if err := FinalizeMany(ctx, tx, msgs); err != nil {
		return res, err
	}
	slices.Sort(msgs)
	res.Messages = len(slices.Compact(msgs))
	return res, nil
}

// CancelMarkedIdle cancels the rows marked for cancelling in those of lanes
// whose drainer is not running (so nobody is sending them), and leaves the
// others to their drainer. It is what a cancel waiting for its marks does
// when a drainer snoozed or stopped before it resolved them.
func CancelMarkedIdle(ctx context.Context, tx pgx.Tx, lanes []string) (BatchResult, error) {
	running, err := lockDrainers(ctx, tx, lanes)
	if err != nil {
		return BatchResult{}, err
	}
	var idle []string
	for _, l := range lanes {
		if !running[l] {
			idle = append(idle, l)
		}
	}
	if len(idle) == 0 {
		return BatchResult{}, nil
	}
	if err := jobs.LockLanes(ctx, tx, idle); err != nil {
		return BatchResult{}, err
	}
	res, err := cancelRows(ctx, tx, `lane = ANY($1) AND cancel_requested_at IS NOT NULL AND status = 'pending'`, idle)
	if err != nil {
		return res, fmt.Errorf("cancel marked deliveries: %w", err)
	}
	return res, nil
}

// CancelMarked cancels the rows of lane marked for cancelling, for the
// lane's drainer, which calls it inside a fenced transaction (so the lane's
// rows have no other writer) when it learned of marks and before it sends
// anything else. It returns how many rows it cancelled.
func CancelMarked(ctx context.Context, tx pgx.Tx, lane string) (int, error) {
	res, err := cancelRows(ctx, tx, `lane = $1 AND cancel_requested_at IS NOT NULL AND status = 'pending'`, lane)
	if err != nil {
		return 0, fmt.Errorf("cancel marked deliveries of lane %s: %w", lane, err)
	}
	return res.Rows, nil
}

// MarkedStatus counts, by status, the rows of ids (rows CancelBatch marked).
func MarkedStatus(ctx context.Context, q DBTX, ids []int64) (map[string][]int64, error) {
	rows, err := q.Query(ctx, `SELECT status, message_id FROM mefor_work WHERE id = ANY($1) ORDER BY id`, ids)
	if err != nil {
		return nil, fmt.Errorf("read marked deliveries: %w", err)
	}
	out := map[string][]int64{}
	var status string
	var msg int64
	if _, err := pgx.ForEachRow(rows, []any{&status, &msg}, func() error {
		out[status] = append(out[status], msg)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read marked deliveries: %w", err)
	}
	return out, nil
}

// MarkedLanes returns the lanes of ids (rows CancelBatch marked) that still
// have one of them pending.
func MarkedLanes(ctx context.Context, q DBTX, ids []int64) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT lane FROM mefor_work WHERE id = ANY($1) AND status = `+PendingByID+` ORDER BY lane`, ids)
	if err != nil {
		return nil, fmt.Errorf("read lanes of marked deliveries: %w", err)
	}
	lanes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read lanes of marked deliveries: %w", err)
	}
	return lanes, nil
}

// ScheduledDrainers returns the River job ids of the lanes' drainers that
// are snoozed (state scheduled), locking those job rows until tx ends so
// they cannot start or change meanwhile. Making such a job available again
// (River's JobRetryTx) wakes the lane now instead of at the end of a backoff
// that an operator just cut short.
func ScheduledDrainers(ctx context.Context, tx pgx.Tx, lanes []string) ([]int64, error) {
	if len(lanes) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `
		SELECT j.id FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = ANY($1) AND j.state = 'scheduled'
		ORDER BY j.id
		FOR UPDATE OF j`, lanes)
	if err != nil {
		return nil, fmt.Errorf("find snoozed drainers: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("find snoozed drainers: %w", err)
	}
	return ids, nil
}

// CountCancel counts the pending deliveries CancelBatch would cancel (the
// failing lane heads with Top), up to and including row id upTo.
func CountCancel(ctx context.Context, q DBTX, f CancelFilter, upTo int64) (int, error) {
	var n int
	var err error
	if f.Top {
		err = q.QueryRow(ctx, `
			SELECT count(*) FROM (
				SELECT DISTINCT ON (lane) id, channel, attempts FROM mefor_work
				WHERE stage = 'outbound' AND status = 'pending' AND destination = $1
				ORDER BY lane, seq
			) h
			WHERE attempts > 0 AND ($2 = '' OR channel = $2) AND id <= $3`,
			f.Destination, f.Channel, upTo).Scan(&n)
	} else {
		err = q.QueryRow(ctx, `
			SELECT count(*) FROM mefor_work
			WHERE stage = 'outbound' AND status = 'pending' AND destination = $1
			  AND ($2 = '' OR channel = $2) AND id <= $3`,
			f.Destination, f.Channel, upTo).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("count pending deliveries to %s: %w", f.Destination, err)
	}
	return n, nil
}
