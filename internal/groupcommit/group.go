// Package groupcommit lets callers that arrive together share one
// transaction without a timer or a goroutine of its own: a caller that
// finds nobody committing commits at once, alone if nobody else is there;
// callers arriving while a commit is in flight queue, and when it ends the
// oldest of them commits everything queued (up to Group.Max), its own item
// included. So a lone caller never waits for company, and under load each
// commit carries what arrived during the previous one.
//
// Intake stores the messages of all of a node's connections this way, and
// the drainers share their hand-offs' transactions.
package groupcommit

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Group queues items of type T for commit functions. The zero value is
// ready; Max zero means no bound, Patience zero waits as long as it takes.
type Group[T any] struct {
	// Max bounds how many items one commit carries.
	Max int
	// Patience bounds how long a queued caller waits for the commit in
	// flight to end: one still queued then leaves, and Do returns false
	// without committing its item, so a commit stuck on one item cannot
	// hold the others for longer than that.
	Patience time.Duration

	mu    sync.Mutex
	queue []*waiter[T]
	busy  bool // a caller is committing; queued callers wait for it
}

// waiter is one caller waiting for its item's commit.
type waiter[T any] struct {
	item T
	// signal gets exactly one send: the item was committed, or, with lead
	// set, it heads the queue and must commit it.
	signal chan struct{}
	lead   bool
}

// Do commits item in whatever batch it ends up in and returns true when that
// batch's commit function has returned; false when it left the queue after
// Patience, its item in no batch. The commit function runs on the
// goroutine of the batch's first caller, with that caller's ctx; it learns
// the outcome for each item through the items themselves (T is usually a
// pointer). A panic in it releases the batch's other callers before it goes
// on up the first caller's stack, so the commit function must record, before
// it panics or in a deferred function, what the others should see.
func (g *Group[T]) Do(ctx context.Context, item T, commit func(context.Context, []T)) bool {
	w := &waiter[T]{item: item, signal: make(chan struct{}, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if g.busy {
		g.mu.Unlock()
		if !g.wait(w) {
			return false
		}
		if !w.lead {
			return true
		}
		g.mu.Lock()
	}
	g.busy = true
	// w heads the queue: it was either alone (nobody was committing) or
	// handed the lead as the oldest waiter.
	n := len(g.queue)
	if g.Max > 0 {
		n = min(n, g.Max)
	}
	batch := g.queue[:n:n]
	g.queue = slices.Clone(g.queue[n:])
	g.mu.Unlock()

	defer g.handOff(w, batch)
	items := make([]T, len(batch))
	for i, b := range batch {
		items[i] = b.item
	}
	commit(ctx, items)
	return true
}

// wait waits for w's signal, or for Patience; it reports false when w left
// the queue unserved.
func (g *Group[T]) wait(w *waiter[T]) bool {
	if g.Patience <= 0 {
		<-w.signal
		return true
	}
	t := time.NewTimer(g.Patience)
	defer t.Stop()
	select {
	case <-w.signal:
		return true
	case <-t.C:
	}
	g.mu.Lock()
	i := slices.Index(g.queue, w)
	if i < 0 || w.lead {
		// Taken into a batch, or just handed the lead: its signal is
		// sent or on its way.
		g.mu.Unlock()
		<-w.signal
		return true
	}
	g.queue = slices.Delete(g.queue, i, i+1)
	g.mu.Unlock()
	return false
}

// Waiting is how many callers are queued behind the commit in flight.
func (g *Group[T]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.busy {
		return 0
	}
	return len(g.queue)
}

// handOff ends w's turn: the oldest waiter, if any, leads next; then the
// batch's other callers learn that their commit ended.
func (g *Group[T]) handOff(w *waiter[T], batch []*waiter[T]) {
	g.mu.Lock()
	if len(g.queue) > 0 {
		next := g.queue[0]
		next.lead = true
		next.signal <- struct{}{}
	} else {
		g.busy = false
	}
	g.mu.Unlock()
	for _, b := range batch {
		if b != w {
			b.signal <- struct{}{}
		}
	}
}
