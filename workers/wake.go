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
}

// NewWake returns an empty Wake.
func NewWake() *Wake { return &Wake{lanes: map[string]chan struct{}{}} }

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
