package workers

import (
	"context"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/pipeline"
)

// A record window gathers a lane's sends whose outcomes are not recorded
// yet. Sends stay one at a time and in order; their records are written in
// one transaction when the window closes: after the destination's
// record_batch rows, once its window has passed since the window's first
// send began (checked before each send), at a failure (recorded with the
// sends before it), and before anything else the drainer writes or reads
// its lane for (a cancel, a dead letter, a crash record, a yield). A
// crash repeats at most the window's sends, the one in flight included:
// at most rows per lane. The drainer waits for its window to be recorded
// before it sends again, whether the record commits alone or shares a
// transaction with other lanes' (Handoffs), so sharing does not widen it.
type recordWindow struct {
	d      *Deps
	r      *run
	limit  config.RecordBatch
	outs   []pipeline.Outcome
	took   []time.Duration
	opened time.Time
	// woken is closed when this node's producers commit to the lane (see
	// moreRows).
	woken <-chan struct{}
}

// add puts a send's outcome in the window; sent is when the send began.
func (w *recordWindow) add(limit config.RecordBatch, o pipeline.Outcome, sent time.Time, took time.Duration) {
	if len(w.outs) == 0 {
		w.opened = sent
	}
	w.limit = limit
	w.outs = append(w.outs, o)
	w.took = append(w.took, took)
}

func (w *recordWindow) empty() bool { return len(w.outs) == 0 }

// full reports whether the window holds as many sends as it may.
func (w *recordWindow) full() bool { return len(w.outs) >= max(w.limit.Rows, 1) }

// deadline is when the window must be recorded at the latest.
func (w *recordWindow) deadline() time.Time { return w.opened.Add(w.limit.Window) }

// expired reports whether the window's time is up: no further send may
// join it.
func (w *recordWindow) expired() bool { return !w.empty() && !time.Now().Before(w.deadline()) }

// flushTimeout bounds recording a window once its execution's context is
// done: the sends happened, and recording them spares their repetition.
const flushTimeout = 10 * time.Second

// flush records the window's sends in one fenced transaction (nothing when
// the execution was superseded), shared with other drainers' hand-offs and
// records when it may be (handOff), and empties it.
func (w *recordWindow) flush(ctx context.Context) (pipeline.Recorded, error) {
	if w.empty() {
		return pipeline.Recorded{Recorded: true}, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	h := pipeline.PrepareRecord(w.r.ex, w.outs)
	err := w.d.handOff(ctx, w.r, h)
	outs, took := w.outs, w.took
	w.outs, w.took = w.outs[:0], w.took[:0]
	if err != nil {
		return pipeline.Recorded{}, err
	}
	rec := h.Recorded()
	// Counted once recorded: sends whose record was refused (fenced) are
	// repeated by the execution that replaced this one.
	for i, o := range outs {
		a := o.Attempt
		w.d.Metrics.Delivered(o.Row.Destination, metrics.OutcomeOf(a.Outcome, a.AckCode), metrics.Answered(a.Outcome), took[i])
		if o.Dead {
			w.d.Metrics.DeadLettered(o.Row.Destination)
		}
	}
	return rec, nil
}

// moreRows waits, while the window is open, for a producer of this node to
// commit rows to the lane after the window's last send, and reads them: a
// lane fed one message at a time still gathers its records. It reads only
// when woken, so a window on a quiet lane costs no query; a commit that
// woke nobody (another node's, or one between the drain loop's read and
// the step) is found by the drain loop's next read, at most a window
// later. It returns nothing when the window's time is up or the node is
// stopping.
func (d *Deps) moreRows(ctx context.Context, lane string, after int64, w *recordWindow) ([]pipeline.Row, error) {
	for {
		wait := time.Until(w.deadline())
		if wait <= 0 {
			return nil, nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-w.woken:
			timer.Stop()
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			timer.Stop()
			return nil, nil
		case <-d.Stopping:
			timer.Stop()
			return nil, nil
		}
		w.woken = d.wakeC(lane) // before reading, so a commit in between still wakes us
		rows, err := d.readLane(ctx, lane, after, d.Limits.Batch)
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			if err := pipeline.OpenBodies(d.Keys, rows); err != nil {
				// Left to the drain loop, which holds the lane on it.
				return nil, nil
			}
			return rows, nil
		}
	}
}
