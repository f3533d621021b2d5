package workers

import (
	"context"

	"github.com/mefor/mefor/internal/groupcommit"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// Reads lets the lane reads of a node's drainers share a round trip. A
// drainer whose read finds no other in flight reads at once, alone, with
// its lane's own statement; reads arriving while one is in flight queue,
// and the oldest of them then reads every lane that queued, of all stages,
// in one round trip (pipeline.PendingRowsOfLanes). Many light lanes, each
// woken for one row, then cost the database one statement per kind of lane
// instead of one per lane: at 50 interfaces, a message was three one-row
// reads, the statement the database ran most.
//
// A read has no effect, so sharing cannot change what a lane does: each
// lane's rows are read by its own probe, head first, as its own read would
// read them, in a snapshot taken no earlier than the drainer asked. A
// shared read that fails answers nobody, and each of its drainers reads
// alone.
type Reads struct {
	g groupcommit.Group[*readReq]
	// hook, for tests, is called by each turn's leader with the number of
	// reads it is about to make.
	hook turnHook
}

// maxSharedReads bounds the lanes of one shared read (each of at most
// Limits.Batch rows).
const maxSharedReads = 32

// NewReads returns a node's read sharing.
func NewReads() *Reads {
	r := &Reads{}
	r.g.Max = maxSharedReads
	return r
}

// Waiting is how many reads wait for the one in flight.
func (r *Reads) Waiting() int { return r.g.Waiting() }

// SetHook makes each turn's leader call f, before it reads, with the
// number of lanes of its turn; for tests (nil removes it).
func (r *Reads) SetHook(f func(reads int)) { r.hook.set(f) }

// readReq is one drainer's read waiting for a turn.
type readReq struct {
	read pipeline.LaneRead
	rows []pipeline.Row
	err  error
	done bool // a turn answered it
}

// readLane reads up to limit pending rows of lane after seq after, sharing
// the round trip with other drainers' reads when d.Reads is set.
func (d *Deps) readLane(ctx context.Context, lane string, after int64, limit int) ([]pipeline.Row, error) {
	if d.Reads == nil {
		return pipeline.PendingRowsAfter(ctx, d.Pool, lane, after, limit)
	}
	req := &readReq{read: pipeline.LaneRead{Lane: lane, After: after, Limit: limit}}
	d.Reads.g.Do(ctx, req, d.readTurn)
	if req.done {
		return req.rows, req.err
	}
	return pipeline.PendingRowsAfter(ctx, d.Pool, lane, after, limit)
}

// readTurn answers batch's reads in one round trip. A lone read is its
// drainer's own, with its context and its error; a shared one is made for
// several drainers, so the leader going away must not abort it, and if it
// fails, each reads again alone.
func (d *Deps) readTurn(ctx context.Context, batch []*readReq) {
	d.Reads.hook.call(len(batch))
	if len(batch) == 1 {
		q := batch[0]
		q.rows, q.err = pipeline.PendingRowsAfter(ctx, d.Pool, q.read.Lane, q.read.After, q.read.Limit)
		q.done = true
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	reads := make([]pipeline.LaneRead, len(batch))
	for i, q := range batch {
		reads[i] = q.read
	}
	out, err := pipeline.PendingRowsOfLanes(ctx, d.Pool, reads)
	if err != nil {
		d.Logger.DebugContext(ctx, "shared lane read failed; each of its lanes is read again alone",
			"lanes", len(batch), "error", err)
		return
	}
	for i, q := range batch {
		q.rows, q.done = out[i], true
		stage, _ := jobs.StageOf(q.read.Lane)
		d.Metrics.LaneReadShared(stage)
	}
}
