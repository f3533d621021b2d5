package workers

import "sync"

// Wake tells a lingering drainer of this node that its lane got work, so it
// need not poll the database at a high rate while it waits. Producers in
// the same process (the node's listeners, the upstream drainers) call Notify
// after their commit; work committed by other nodes is found by the slower
// fallback poll.
type Wake struct {
	mu    sync.Mutex
	lanes map[string]chan struct{}
	// running counts this node's drainer executions per lane (one, but a
	// superseded execution may overlap its successor for a moment).
	running map[string]int
}

// NewWake returns an empty Wake.
func NewWake() *Wake {
	return &Wake{lanes: map[string]chan struct{}{}, running: map[string]int{}}
}

// Run records that a drainer of this node serves lane until done is called.
func (w *Wake) Run(lane string) (done func()) {
	if w == nil {
		return func() {}
	}
	w.mu.Lock()
	w.running[lane]++
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.running[lane]--; w.running[lane] <= 0 {
			delete(w.running, lane)
		}
	}
}

// Running reports whether a drainer of this node serves every one of
// lanes. It is a hint, not a proof: the drainer may be completing at this
// moment, and only the database's live-drainer check decides (it is what
// lets a hand-off skip its transaction block, drainer.Trip).
func (w *Wake) Running(lanes []string) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, lane := range lanes {
		if w.running[lane] == 0 {
			return false
		}
	}
	return true
}

// C returns a channel closed by the next Notify of lane. Take it before
// looking at the lane, so a commit that lands in between is not missed.
func (w *Wake) C(lane string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.lanes[lane]
	if !ok {
		ch = make(chan struct{})
		w.lanes[lane] = ch
	}
	return ch
}

// Notify wakes every drainer waiting on the lanes.
func (w *Wake) Notify(lanes ...string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, lane := range lanes {
		if ch, ok := w.lanes[lane]; ok {
			close(ch)
			delete(w.lanes, lane)
		}
	}
}
