package ops

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/pipeline"
)

// Replay and cancel types, as ops returns them.
type (
	// ReplayResult says what Replay re-queued.
	ReplayResult = pipeline.ReplayResult
	// CancelFilter narrows Cancel.
	CancelFilter = pipeline.CancelFilter
)

// Replay modes (ReplayResult.Mode).
const (
	ReplayRecover = pipeline.ReplayRecover
	ReplayResend  = pipeline.ReplayResend
)

// ErrBodyPurged is returned when a message's body was purged by retention,
// so it cannot be replayed.
var ErrBodyPurged = pipeline.ErrBodyPurged

// DefaultBatchSize is how many rows a bulk operation changes per
// transaction: small enough to keep locks short and within PostgreSQL's
// lock table (each message touched takes an advisory lock), large enough to
// move tens of thousands of rows a minute.
const DefaultBatchSize = 500

// Replay re-queues one message (see pipeline.ReplayMessage for the rules): its
// dead and pending rows if it has any, else its delivered outbound rows.
// Rows == 0 in the result means there was nothing to replay, which is not an
// error. A pending row that was waiting out a backoff is due at once, and its
// lane's snoozed drainer is woken in the same transaction. The database
// function does it all, drainers included.
func Replay(ctx context.Context, pool *pgxpool.Pool, messageID int64) (pipeline.ReplayResult, error) {
	var res pipeline.ReplayResult
	target := map[string]any{"message_id": messageID}
	err := auditedInDB(ctx, pool, audit.ActionReplay, target, func(tx pgx.Tx, a pipeline.Audit) error {
		var err error
		res, err = pipeline.ReplayMessage(ctx, tx, a, messageID)
		return err
	})
	return res, err
}

// BulkOptions tunes ReplayDead and Cancel.
type BulkOptions struct {
	// BatchSize is how many rows one transaction changes. Defaults to
	// DefaultBatchSize (500) when not positive.
	BatchSize int
	// Confirm, when set, is called with the number of matching rows before
	// anything changes; returning false stops with nothing done.
	Confirm func(matched int) (bool, error)
	// Progress, when set, is called after each committed batch with the
	// rows handled so far (changed or skipped) and the number matched.
	Progress func(done, matched int)
	// Wait bounds how long Cancel waits for the rows it could not cancel at
	// once (their lane's drainer was running, so it may have been sending
	// them) to be resolved by that drainer. Defaults to zero: no wait.
	Wait time.Duration
}

func (o BulkOptions) batch() int {
	if o.BatchSize <= 0 {
		return DefaultBatchSize
	}
	return o.BatchSize
}

// BulkResult is what ReplayDead or Cancel did.
type BulkResult struct {
	// Matched is how many rows matched when the operation started.
	Matched int `json:"matched"`
	// Rows is how many rows were changed.
	Rows int `json:"rows"`
	// Skipped counts rows left alone because their body was purged
	// (ReplayDead only).
	Skipped int `json:"skipped,omitempty"`
	// Messages counts the messages touched (a message touched by two
	// batches counts twice).
	Messages int `json:"messages"`
	// Declined is true when Confirm said no.
	Declined bool `json:"declined,omitempty"`

	// The rows Cancel found in a lane whose drainer was running, and how
	// each ended (those that ended cancelled are counted in Rows).
	// Delivered were being sent: the partner has them, and their replies
	// are kept. Dead were being sent and failed past max_attempts.
	// InFlight were still undecided when the wait ended: each will be
	// cancelled unless its drainer had already sent it.
	Delivered         int     `json:"delivered,omitempty"`
	DeliveredMessages []int64 `json:"delivered_messages,omitempty"`
	Dead              int     `json:"dead,omitempty"`
	DeadMessages      []int64 `json:"dead_messages,omitempty"`
	InFlight          int     `json:"in_flight,omitempty"`
	InFlightMessages  []int64 `json:"in_flight_messages,omitempty"`
}

// ErrNoDestination is returned by Cancel without a destination.
var ErrNoDestination = errors.New("cancel needs a destination")

// ReplayDead re-queues every dead outbound row matching f that exists when
// it starts, in batches of one transaction each, at the back of their lanes;
// each message goes from error back to routed with a replayed event per row.
// Rows dead-lettered while it runs are not chased. An error stops it: the
// batches committed before stay committed and the result counts them.
func ReplayDead(ctx context.Context, pool *pgxpool.Pool, f pipeline.DeadFilter, opt BulkOptions) (BulkResult, error) {
	var res BulkResult
	upTo, err := pipeline.MaxWorkID(ctx, pool)
	if err != nil {
		return res, err
	}
	if res.Matched, err = pipeline.CountDeadOutbound(ctx, pool, f, upTo); err != nil {
		return res, err
	}
	return runBulk(ctx, &res, opt, func(after int64) (pipeline.BatchResult, error) {
		var b pipeline.BatchResult
		target := map[string]any{"channel": f.Channel, "destination": f.Destination, "after_work_id": after,
			"up_to_work_id": upTo, "matched": res.Matched}
		err := auditedInDB(ctx, pool, audit.ActionReplayDead, target, func(tx pgx.Tx, a pipeline.Audit) error {
			var err error
			b, err = pipeline.ReplayDeadBatch(ctx, tx, a, f, after, upTo, opt.batch())
			return err
		})
		return b, err
	})
}

// Cancel cancels pending outbound rows of a destination (all its lanes) that
// exist when it starts, in batches, with a cancelled event each, and
// finalizes their messages. With f.Top it cancels only the failing head of
// each lane (see pipeline.CancelFilter). Lanes whose rows were cancelled have
// their snoozed drainers woken, so a lane unblocked by the cancel moves now.
//
// A row in a lane whose drainer is running is never cancelled under the
// drainer's feet: it is marked, and the drainer cancels it unless it was
// already sending it, in which case it ends delivered (or failed) as the
// partner answered. Cancel waits up to opt.Wait for those rows and reports
// how each ended; a lane whose drainer stops running meanwhile has its
// marked rows cancelled here.
func Cancel(ctx context.Context, pool *pgxpool.Pool, f pipeline.CancelFilter, opt BulkOptions) (BulkResult, error) {
	var res BulkResult
	if f.Destination == "" {
		return res, ErrNoDestination
	}
	upTo, err := pipeline.MaxWorkID(ctx, pool)
	if err != nil {
		return res, err
	}
	limit := opt.batch()
	if f.Top {
		// A head per lane: one batch holds them all (a destination has a
		// handful of lanes), and no second pass may pick the new heads.
		limit = 1 << 20
	}
	if res.Matched, err = pipeline.CountCancel(ctx, pool, f, upTo); err != nil {
		return res, err
	}
	batches := 0
	var marked []int64
	res, err = runBulk(ctx, &res, opt, func(after int64) (pipeline.BatchResult, error) {
		var b pipeline.BatchResult
		if f.Top && batches > 0 {
			return b, nil
		}
		batches++
		target := map[string]any{"channel": f.Channel, "destination": f.Destination, "top": f.Top,
			"after_work_id": after, "up_to_work_id": upTo, "matched": res.Matched}
		err := auditedInDB(ctx, pool, audit.ActionCancel, target, func(tx pgx.Tx, a pipeline.Audit) error {
			var err error
			b, err = pipeline.CancelBatch(ctx, tx, a, f, after, upTo, limit)
			return err
		})
		marked = append(marked, b.Marked...)
		return b, err
	})
	if err != nil || len(marked) == 0 {
		return res, err
	}
	return res, awaitMarked(ctx, pool, marked, opt.Wait, &res)
}

// markPoll is how often Cancel looks at the rows it marked.
const markPoll = 100 * time.Millisecond

// awaitMarked waits up to wait for the marked rows to leave pending, cancels
// those whose lane's drainer stopped running, and adds how they ended to res.
func awaitMarked(ctx context.Context, pool *pgxpool.Pool, marked []int64, wait time.Duration, res *BulkResult) error {
	deadline := time.Now().Add(wait)
	for {
		lanes, err := pipeline.MarkedLanes(ctx, pool, marked)
		if err != nil {
			return err
		}
		if len(lanes) > 0 {
			var b pipeline.BatchResult
			target := map[string]any{"lanes": lanes, "marked_rows": "idle"}
			err := auditedInDB(ctx, pool, audit.ActionCancel, target, func(tx pgx.Tx, a pipeline.Audit) error {
				var err error
				b, err = pipeline.CancelMarkedIdle(ctx, tx, a, lanes)
				return err
			})
			if err != nil {
				return err
			}
			if b.Rows > 0 {
				lanes, err = pipeline.MarkedLanes(ctx, pool, marked)
				if err != nil {
					return err
				}
			}
		}
		if len(lanes) == 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(markPoll):
		}
	}
	ended, err := pipeline.MarkedStatus(ctx, pool, marked)
	if err != nil {
		return err
	}
	res.Rows += len(ended[pipeline.WorkCancelled])
	res.Messages += countDistinct(ended[pipeline.WorkCancelled])
	res.DeliveredMessages, res.Delivered = ended[pipeline.WorkDone], len(ended[pipeline.WorkDone])
	res.DeadMessages, res.Dead = ended[pipeline.WorkDead], len(ended[pipeline.WorkDead])
	res.InFlightMessages, res.InFlight = ended[pipeline.WorkPending], len(ended[pipeline.WorkPending])
	return nil
}

func countDistinct(ids []int64) int {
	s := slices.Clone(ids)
	slices.Sort(s)
	return len(slices.Compact(s))
}

// runBulk asks for confirmation, then runs batches until one sees no rows.
func runBulk(ctx context.Context, res *BulkResult, opt BulkOptions, batch func(after int64) (pipeline.BatchResult, error)) (BulkResult, error) {
	if res.Matched == 0 {
		return *res, nil
	}
	if opt.Confirm != nil {
		ok, err := opt.Confirm(res.Matched)
		if err != nil {
			return *res, err
		}
		if !ok {
			res.Declined = true
			return *res, nil
		}
	}
	var after int64
	done := 0
	for {
		if err := ctx.Err(); err != nil {
			return *res, err
		}
		b, err := batch(after)
		if err != nil {
			return *res, err
		}
		if b.Seen == 0 {
			return *res, nil
		}
		after = b.LastID
		res.Rows += b.Rows
		res.Skipped += b.Skipped
		res.Messages += b.Messages
		done += b.Seen
		if opt.Progress != nil {
			opt.Progress(min(done, res.Matched), res.Matched)
		}
	}
}
