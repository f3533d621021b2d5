package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/groupcommit"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
)

// maxCommitBatch bounds how many messages one intake commit stores, so a
// burst is cut into commits of a bounded size (and statement).
const maxCommitBatch = 64

// groupCommit stores the messages of all of a node's connections and
// channels that arrive together in one transaction (package groupcommit),
// up to maxCommitBatch at a time.
type groupCommit struct {
	once sync.Once // sets g.Max: Intake is built as a literal
	g    groupcommit.Group[*commitReq]
}

// commitReq is one message waiting to be stored.
type commitReq struct {
	msg    pipeline.Inbound
	queued time.Time // when it was handed to the group
	id     int64
	err    error
}

// do stores r.msg, in whatever batch it ends up in, and returns when that
// batch's transaction has ended.
func (g *groupCommit) do(ctx context.Context, r *commitReq, commit func(context.Context, []*commitReq)) {
	g.once.Do(func() { g.g.Max = maxCommitBatch })
	g.g.Do(ctx, r, func(ctx context.Context, batch []*commitReq) {
		defer func() {
			// A panic (recovered by the listener for this connection) must
			// not leave the others unanswered as if stored.
			if v := recover(); v != nil {
				for _, q := range batch {
					if q.id == 0 && q.err == nil {
						q.err = errCommitPanicked
					}
				}
				panic(v)
			}
		}()
		commit(ctx, batch)
	})
}

// laneClock is when intake last stored a message into each lane.
type laneClock struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// allSince reports whether every one of lanes was last stored into at or
// after t.
func (c *laneClock) allSince(lanes []string, t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range lanes {
		if at, ok := c.last[l]; !ok || at.Before(t) {
			return false
		}
	}
	return true
}

// mark records that lanes were stored into at t. The map holds a key per
// channel's ingress lane, so it stays as small as the config.
func (c *laneClock) mark(lanes []string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]time.Time{}
	}
	for _, l := range lanes {
		c.last[l] = t
	}
}

// errCommitPanicked refuses the messages of a batch whose commit panicked.
var errCommitPanicked = errors.New("intake commit failed unexpectedly")

// commitBatch stores a batch in one transaction. If the database refused
// it (an error it reported, so it rolled everything back), each message is
// stored again on its own, so a message that must be refused (its lease
// lost, a row the database rejects) is the only one refused; a batch whose
// fate is unknown (the connection failed) refuses everyone, as one message
// would be refused.
func (in *Intake) commitBatch(ctx context.Context, batch []*commitReq) {
	// The callers all wait on this commit; the one whose goroutine runs it
	// must not abort it for the others by going away.
	ctx = context.WithoutCancel(ctx)
	if in.onCommit != nil {
		in.onCommit(len(batch))
	}
	start := time.Now()
	ms := make([]pipeline.Inbound, len(batch))
	var lanes []string
	for i, r := range batch {
		in.Metrics.IntakeWaited(start.Sub(r.queued))
		ms[i] = r.msg
		if r.msg.ParseError == "" {
			lanes = append(lanes, jobs.IngressLane(r.msg.Channel))
		}
	}
	receive := pipeline.ReceiveBatch
	if in.Linger > 0 && !in.lanes.allSince(lanes, in.now().Add(-in.Linger)) {
		receive = pipeline.ReceiveBatchActivating
	}
	ids, err := receive(ctx, in.Pool, in.Inserter, ms)
	in.Metrics.IntakeCommitted(len(batch), time.Since(start))
	if err == nil {
		in.lanes.mark(lanes, in.now())
		for i, r := range batch {
			r.id = ids[i]
		}
		return
	}
	var pgErr *pgconn.PgError
	if len(batch) == 1 || !(errors.As(err, &pgErr) || errors.Is(err, leader.ErrNotLeaseHolder)) {
		for _, r := range batch {
			r.err = err
		}
		return
	}
	in.Logger.WarnContext(ctx, "intake batch refused, storing its messages one by one", "messages", len(batch), "error", err)
	lost := errors.Is(err, leader.ErrNotLeaseHolder)
	for _, r := range batch {
		if lost && r.msg.LeaseOwner != "" {
			// Every owner in a batch is this node's: the lease is gone for all.
			r.err = err
			continue
		}
		if in.onCommit != nil {
			in.onCommit(1)
		}
		t0 := time.Now()
		ids, err := pipeline.ReceiveBatch(ctx, in.Pool, in.Inserter, []pipeline.Inbound{r.msg})
		in.Metrics.IntakeCommitted(1, time.Since(t0))
		if err != nil {
			r.err = err
			continue
		}
		r.id = ids[0]
	}
}
