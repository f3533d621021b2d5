package auditforward

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sethvargo/go-retry"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/dbpool"
)

// Item is one thing forwarded: an audit row or an anchor (exactly one is
// set).
type Item struct {
	Row    *audit.Record
	Anchor *audit.StoredAnchor
}

// Sender delivers a batch to a receiver. It returns nil only once the
// receiver accepted the whole batch (see the package doc for what that
// means per target); its errors name the receiver, never an item's
// content.
type Sender interface {
	Send(ctx context.Context, items []Item) error
}

// Forwarder sends the audit trail to one target from its cursor.
type Forwarder struct {
	DB     dbpool.DBTX
	Target string
	Sender Sender
	// Batch is how many rows (and anchors) one send carries. Defaults to
	// 500.
	Batch int
	// RetryMin and RetryMax bound the backoff between attempts at a batch
	// the receiver did not accept. Default to 1s and 1m.
	RetryMin, RetryMax time.Duration
	// RetryFor is how long one Run keeps retrying a batch before it gives
	// up (the next run starts again from the cursor). Defaults to 30s.
	RetryFor time.Duration
	Logger   *slog.Logger
}

// Result is what one Run did.
type Result struct {
	Rows, Anchors int
	// Cursor is where the target stands after the run.
	Cursor Cursor
}

// Run sends batches until the target has the whole log and every anchor,
// ctx ends, or a batch still fails after RetryFor; a failure is recorded
// in the cursor (its error, when) and returned.
func (f *Forwarder) Run(ctx context.Context) (Result, error) {
	var res Result
	logger := f.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	for {
		cur, err := ReadCursor(ctx, f.DB, f.Target)
		if err != nil {
			return res, err
		}
		res.Cursor = cur
		items, seq, anchorNo, err := f.next(ctx, cur)
		if err != nil || len(items) == 0 {
			return res, err
		}
		attempt := 0
		var lastErr error
		err = retry.Do(ctx, f.backoff(), func(ctx context.Context) error {
			attempt++
			if err := f.Sender.Send(ctx, items); err != nil {
				lastErr = err
				logger.WarnContext(ctx, "audit forward: the receiver did not accept a batch; retrying",
					"target", f.Target, "from_seq", cur.Seq+1, "to_seq", seq, "attempt", attempt, "error", err)
				_ = recordFailure(ctx, f.DB, f.Target, err.Error())
				return retry.RetryableError(err)
			}
			return nil
		})
		if err != nil {
			if lastErr != nil && ctx.Err() != nil {
				// The run's time is up: the receiver's refusal says more.
				err = lastErr
			}
			err = fmt.Errorf("forward audit rows %d to %d to %s: %w", cur.Seq+1, seq, f.Target, err)
			_ = recordFailure(context.WithoutCancel(ctx), f.DB, f.Target, err.Error())
			return res, err
		}
		if err := advance(ctx, f.DB, cur, seq, anchorNo); err != nil {
			return res, err
		}
		for _, it := range items {
			if it.Row != nil {
				res.Rows++
			} else {
				res.Anchors++
			}
		}
		res.Cursor.Seq, res.Cursor.AnchorNo = seq, anchorNo
	}
}

// next reads the batch after cur: rows in seq order, each anchor after the
// row it covers; it returns the cursor values the batch takes the target
// to.
func (f *Forwarder) next(ctx context.Context, cur Cursor) (items []Item, seq, anchorNo int64, err error) {
	limit := f.Batch
	if limit <= 0 {
		limit = 500
	}
	rows, err := audit.RowsAfter(ctx, f.DB, cur.Seq, limit)
	if err != nil {
		return nil, 0, 0, err
	}
	seq = cur.Seq
	if len(rows) > 0 {
		seq = rows[len(rows)-1].Seq
	}
	anchors, err := audit.AnchorsAfter(ctx, f.DB, cur.AnchorNo, limit)
	if err != nil {
		return nil, 0, 0, err
	}
	anchorNo = cur.AnchorNo
	a := 0
	for i := range rows {
		for a < len(anchors) && anchors[a].Seq < rows[i].Seq {
			items = append(items, Item{Anchor: &anchors[a]})
			anchorNo = anchors[a].No
			a++
		}
		items = append(items, Item{Row: &rows[i]})
	}
	// Anchors of rows already sent or in this batch; later ones wait
	// for their row.
	for a < len(anchors) && anchors[a].Seq <= seq {
		items = append(items, Item{Anchor: &anchors[a]})
		anchorNo = anchors[a].No
		a++
	}
	return items, seq, anchorNo, nil
}

func (f *Forwarder) backoff() retry.Backoff {
	lo, hi, total := f.RetryMin, f.RetryMax, f.RetryFor
	if lo <= 0 {
		lo = time.Second
	}
	if hi <= 0 {
		hi = time.Minute
	}
	if total <= 0 {
		total = 30 * time.Second
	}
	b := retry.NewExponential(lo)
	b = retry.WithJitterPercent(10, b)
	b = retry.WithCappedDuration(hi, b)
	return retry.WithMaxDuration(total, b)
}
