package workers

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/internal/groupcommit"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
)

// Handoffs lets the route and transform hand-offs of a node's drainers
// share transactions. A drainer whose hand-off finds no other in flight
// commits it at once, alone; hand-offs arriving while one is in flight
// queue, and the oldest of them then commits all that queued, of any lanes
// and both stages, in one transaction whose every statement carries all of
// their rows (drainer.RunHandoffs). Many light lanes, each handing off one
// row at a time, then cost the database one transaction and one set of
// statements per commit instead of one per lane.
//
// Each lane's order is untouched: a lane has one drainer, which waits for
// its hand-off to commit before it reads the lane again, and the lanes
// written are locked before any row is. Fencing is untouched: the shared
// transaction checks every execution's fence, and if any is superseded, or
// anything else fails, nothing of it commits and every hand-off of it is
// committed again alone, as it would have been without sharing. That is
// safe even when the shared commit's fate is unknown: a hand-off consumes
// only rows still pending and produces only for what it consumed.
//
// One lane must not hold up the others: a hand-off waits for the commit in
// flight at most Patience before it commits alone, and a shared
// transaction waits at most drainer.SharedLockTimeout for any lock (a lane
// an operator's transaction holds, say) before it gives up and its
// hand-offs are committed alone.
type Handoffs struct {
	g groupcommit.Group[*handoffReq]
}

// maxSharedHandoffs bounds the hand-offs of one shared transaction (each of
// at most Limits.Batch rows).
const maxSharedHandoffs = 16

// DefaultHandoffPatience is how long a hand-off waits for the one in
// flight before it commits alone.
const DefaultHandoffPatience = 100 * time.Millisecond

// NewHandoffs returns a node's hand-off sharing; patience zero means
// DefaultHandoffPatience.
func NewHandoffs(patience time.Duration) *Handoffs {
	if patience <= 0 {
		patience = DefaultHandoffPatience
	}
	h := &Handoffs{}
	h.g.Max, h.g.Patience = maxSharedHandoffs, patience
	return h
}

// Waiting is how many hand-offs wait for the one in flight.
func (h *Handoffs) Waiting() int { return h.g.Waiting() }

// handoffReq is one drainer's hand-off waiting for a transaction.
type handoffReq struct {
	h     *drainer.Handoff
	ins   jobs.Inserter
	stage string
	// committed is set once a transaction that carried it has committed;
	// done is set with err once it was run alone in the leader's turn.
	committed, done bool
	err             error
}

// handOff commits h, sharing a transaction with other drainers' hand-offs
// when d.Handoffs is set and h allows it.
func (d *Deps) handOff(ctx context.Context, r *run, h *drainer.Handoff) error {
	alone := func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, d.Pool, store.PipelineTx, func(tx pgx.Tx) error {
			return drainer.RunHandoffs(ctx, tx, r.ins, h)
		})
	}
	if d.Handoffs == nil || !h.Shareable() {
		return alone(ctx)
	}
	stage, _ := jobs.StageOf(r.lane)
	req := &handoffReq{h: h, ins: r.ins, stage: stage}
	queued := d.Handoffs.g.Do(ctx, req, func(ctx context.Context, batch []*handoffReq) {
		if len(batch) == 1 { // req alone: nobody else was waiting
			req.err, req.done = alone(ctx), true
			return
		}
		d.commitShared(ctx, batch)
	})
	switch {
	case !queued:
		return alone(ctx) // the hand-off in flight took longer than Patience
	case req.done:
		return req.err
	case req.committed:
		return nil
	default:
		// The shared transaction did not commit: this hand-off's own
		// outcome decides, alone.
		return alone(ctx)
	}
}

// commitShared commits batch's hand-offs in one transaction, marking each
// committed when it did. The others wait on it, so the leader going away
// must not abort it.
func (d *Deps) commitShared(ctx context.Context, batch []*handoffReq) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	hs := make([]*drainer.Handoff, len(batch))
	rows := 0
	for i, q := range batch {
		hs[i] = q.h
		rows += q.h.Rows()
	}
	err := pgx.BeginTxFunc(ctx, d.Pool, store.PipelineTx, func(tx pgx.Tx) error {
		return drainer.RunHandoffs(ctx, tx, batch[0].ins, hs...)
	})
	if err != nil {
		d.Logger.DebugContext(ctx, "shared hand-off transaction failed; each hand-off is committed alone",
			"handoffs", len(batch), "rows", rows, "error", err)
		return
	}
	for _, q := range batch {
		q.committed = true
		d.Metrics.HandoffShared(q.stage)
	}
}
