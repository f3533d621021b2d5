package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/dbpool"
)

// CancelFilter selects the pending deliveries CancelBatch cancels.
type CancelFilter struct {
	Destination string // required
	Channel     string // empty: rows of every channel
	// Top cancels only the head of each lane of the destination whose head
	// has failed at least once (the rows blocking their lanes); with Channel
	// set, only heads of that channel. Healthy lanes are left alone.
	Top bool
}

// CancelBatch cancels, through mefor_cancel, up to limit pending outbound
// rows matching f with after < id <= upTo, records a cancelled event each
// and finalizes their messages (locked in id order). A row a drainer
// finished meanwhile is left as it is. Lanes with rows cancelled have their
// snoozed drainers woken, and a batch that saw a row appends the cancel
// audit row (a's target with the counts).
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
func CancelBatch(ctx context.Context, tx pgx.Tx, a Audit, f CancelFilter, after, upTo int64, limit int) (BatchResult, error) {
	var res BatchResult
	if f.Destination == "" {
		return res, errors.New("cancel needs a destination")
	}
	err := tx.QueryRow(ctx, `
		SELECT seen, n_rows, messages, last_id, marked, lanes
		FROM mefor_cancel($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		f.Destination, f.Channel, f.Top, after, upTo, limit, a.OSUser, a.Host, a.target()).
		Scan(&res.Seen, &res.Rows, &res.Messages, &res.LastID, &res.Marked, &res.Lanes)
	if err != nil {
		return res, operatorError(err, "cancel deliveries to "+f.Destination)
	}
	if len(res.Marked) == 0 {
		res.Marked = nil
	}
	return res, nil
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

// CancelMarkedIdle cancels, through mefor_cancel_marked_idle, the rows
// marked for cancelling in those of lanes whose drainer is not running (so
// nobody is sending them), and leaves the others to their drainer. It is
// what a cancel waiting for its marks does when a drainer snoozed or
// stopped before it resolved them. When it cancelled any it wakes their
// lanes' snoozed drainers and appends a cancel audit row (a's target with
// the counts).
func CancelMarkedIdle(ctx context.Context, tx pgx.Tx, a Audit, lanes []string) (BatchResult, error) {
	var res BatchResult
	err := tx.QueryRow(ctx, `SELECT n_rows, messages, lanes FROM mefor_cancel_marked_idle($1, $2, $3, $4)`,
		lanes, a.OSUser, a.Host, a.target()).Scan(&res.Rows, &res.Messages, &res.Lanes)
	if err != nil {
		return res, operatorError(err, "cancel marked deliveries")
	}
	return res, nil
}

// cancelMarked cancels the rows of lane marked for cancelling, for the
// lane's drainer, which calls it inside a fenced transaction (so the lane's
// rows have no other writer) when it learned of marks and before it sends
// anything else. It returns how many rows it cancelled.
func cancelMarked(ctx context.Context, tx pgx.Tx, lane string) (int, error) {
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
	return dbpool.Column[string](ctx, q, "read lanes of marked deliveries", `SELECT DISTINCT lane FROM mefor_work WHERE id = ANY($1) AND status = `+PendingByID+` ORDER BY lane`, ids)
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
