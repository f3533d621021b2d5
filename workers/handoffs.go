package workers

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/groupcommit"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// Handoffs lets the route and transform hand-offs and the delivery records
// of a node's drainers share transactions. A drainer whose hand-off (or
// record window) finds no other in flight commits it at once, alone;
// hand-offs arriving while one is in flight queue, and the oldest of them
// then commits all that queued, of any lanes and all stages, in one
// transaction whose every statement carries all of their rows
// (pipeline.RunHandoffs). Many light lanes, each handing off one row at a
// time, then cost the database one transaction and one set of statements
// per commit instead of one per lane.
//
// Each lane's order is untouched: a lane has one drainer, which waits for
// its hand-off to commit before it reads the lane again, and the lanes
// written are locked before any row is. Fencing is untouched: the shared
// transaction checks every execution's fence, and if any is superseded, or
// anything else fails, nothing of it commits and every hand-off of it is
// committed again alone, as it would have been without sharing. That is
// safe even when the shared commit's fate is unknown: a hand-off consumes
// only rows still pending and produces only for what it consumed, and a
// shared record only records rows still pending as delivered (a record
// with a failed attempt, which would count twice, never shares).
//
// One lane must not hold up the others. Every transaction committed in
// the group's turn, a hand-off alone included, waits for a lock at most
// dbpool.Handoff.Lock (a lane an operator's transaction holds, say); when it
// fails, its hand-offs leave the group and each is committed again alone,
// waiting for its lock as long as a node's session does (dbpool.NodeSession). And a hand-off waits for the one in
// flight at most its patience before it commits alone.
type Handoffs struct {
	g groupcommit.Group[*handoffReq]
	// hook, for tests, is called by each turn's leader with the number of
	// hand-offs it is about to commit.
	hook turnHook
}

// turnHook is a test's function that the leader of each turn of a group
// (hand-offs, reads) calls with the size of its turn before it runs it.
type turnHook struct{ f atomic.Pointer[func(n int)] }

// set makes f the hook; nil removes it.
func (t *turnHook) set(f func(n int)) {
	if f == nil {
		t.f.Store(nil)
		return
	}
	t.f.Store(&f)
}

// call calls the hook, if any, with n.
func (t *turnHook) call(n int) {
	if f := t.f.Load(); f != nil {
		(*f)(n)
	}
}

// maxSharedHandoffs bounds the hand-offs of one shared transaction (each of
// at most Limits.Batch rows).
const maxSharedHandoffs = 16

// groupTx begins the transactions of the group's turns, under the
// dbpool.Handoff timeouts (a lock wait of 100ms).
var groupTx = pipeline.PipelineTxTimeouts(dbpool.Handoff)

// DefaultHandoffPatience is how long a hand-off waits for the one in
// flight before it commits alone. With no lock wait longer than
// dbpool.Handoff.Lock, the turn in flight is slow only when the database is:
// then waiting for it, and sharing the next, is cheaper than a transaction
// more.
const DefaultHandoffPatience = time.Second

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

// SetHook makes each turn's leader call f, before it commits, with the
// number of hand-offs of its turn; for tests (nil removes it).
func (h *Handoffs) SetHook(f func(handoffs int)) { h.hook.set(f) }

// handoffReq is one drainer's hand-off waiting for a transaction.
type handoffReq struct {
	h     *pipeline.Handoff
	ins   jobs.Inserter
	stage string
	// committed is set once a transaction of the group's turns carried it.
	committed bool
}

// handOff commits h, sharing a transaction with other drainers' hand-offs
// when d.Handoffs is set and h allows it.
func (d *Deps) handOff(ctx context.Context, r *run, h *pipeline.Handoff) error {
	alone := func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, d.Pool, pipeline.PipelineTx, func(tx pgx.Tx) error {
			return pipeline.RunHandoffs(ctx, tx, r.ins, h)
		})
	}
	if d.Handoffs == nil || !h.Shareable() {
		return alone(ctx)
	}
	stage, _ := jobs.StageOf(r.lane)
	req := &handoffReq{h: h, ins: r.ins, stage: stage}
	d.Handoffs.g.Do(ctx, req, func(ctx context.Context, batch []*handoffReq) { d.commitTurn(ctx, batch) })
	if req.committed {
		return nil
	}
	// Not committed in the group's turns (the turn in flight outlasted the
	// patience, or this one's transaction failed): this hand-off's own
	// outcome decides, alone.
	return alone(ctx)
}

// commitTurn commits batch's hand-offs in one transaction begun with the
// group's lock wait, marking each committed when it did. The others wait on
// it, so the leader going away must not abort it.
func (d *Deps) commitTurn(ctx context.Context, batch []*handoffReq) {
	d.Handoffs.hook.call(len(batch))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	hs := make([]*pipeline.Handoff, len(batch))
	rows := 0
	for i, q := range batch {
		hs[i] = q.h
		rows += q.h.Rows()
	}
	err := pgx.BeginTxFunc(ctx, d.Pool, groupTx, func(tx pgx.Tx) error {
		return pipeline.RunHandoffs(ctx, tx, batch[0].ins, hs...)
	})
	if err != nil {
		d.Metrics.HandoffTurnFailed()
		d.Logger.DebugContext(ctx, "hand-off transaction failed; each of its hand-offs is committed again alone",
			"handoffs", len(batch), "rows", rows, "error", err)
		return
	}
	for _, q := range batch {
		q.committed = true
		if len(batch) > 1 {
			d.Metrics.HandoffShared(q.stage)
		}
	}
}
