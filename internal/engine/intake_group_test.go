package engine

import (
	"context"
	"testing"
	"time"
)

// A caller that finds nobody committing commits at once, alone; callers
// arriving while that commit is in flight wait, and the first of them then
// commits them all in one batch.
func TestGroupCommitLeaderTakesWhatQueued(t *testing.T) {
	t.Parallel()
	var g groupCommit
	started := make(chan int, 4)
	release := make(chan struct{})
	commit := func(_ context.Context, batch []*commitReq) {
		started <- len(batch)
		<-release
		for _, r := range batch {
			r.id = 1
		}
	}
	do := func() <-chan *commitReq {
		out := make(chan *commitReq, 1)
		go func() {
			r := &commitReq{}
			g.do(context.Background(), r, commit)
			out <- r
		}()
		return out
	}
	lone := do()
	select {
	case n := <-started:
		if n != 1 {
			t.Fatalf("lone caller's commit carried %d messages, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone caller's commit did not start: it waits for company")
	}
	later := []<-chan *commitReq{do(), do()}
	for queued := 0; queued < 2; {
		g.mu.Lock()
		queued = len(g.queue)
		g.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	close(release)
	if n := <-started; n != 2 {
		t.Fatalf("the commit after the first carried %d messages, want the 2 that queued", n)
	}
	for _, ch := range append(later, lone) {
		if r := <-ch; r.id != 1 || r.err != nil {
			t.Fatalf("caller returned %+v before its commit", r)
		}
	}
	if g.busy || len(g.queue) != 0 {
		t.Fatalf("after all commits: busy %v, %d queued", g.busy, len(g.queue))
	}
}

// A commit that panics refuses the rest of its batch, and intake goes on.
func TestGroupCommitSurvivesAPanickingCommit(t *testing.T) {
	t.Parallel()
	var g groupCommit
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	blocking := func(_ context.Context, batch []*commitReq) {
		started <- struct{}{}
		<-release
		for _, r := range batch {
			r.id = 1
		}
	}
	panicking := func(context.Context, []*commitReq) { panic("boom") }
	queueLen := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue)
	}
	go g.do(context.Background(), &commitReq{}, blocking)
	<-started
	// A and B queue behind it; A leads their batch with a commit that panics.
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		g.do(context.Background(), &commitReq{}, panicking)
	}()
	for queueLen() < 1 {
		time.Sleep(time.Millisecond)
	}
	b := make(chan *commitReq, 1)
	go func() {
		r := &commitReq{}
		g.do(context.Background(), r, blocking)
		b <- r
	}()
	for queueLen() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if v := <-panicked; v == nil {
		t.Fatal("the panic was swallowed")
	}
	if r := <-b; r.err == nil {
		t.Fatalf("B, batched with the panicked commit, got %+v; want an error", r)
	}
	r := &commitReq{}
	g.do(context.Background(), r, func(_ context.Context, b []*commitReq) { b[0].id = 7 })
	if r.id != 7 {
		t.Fatal("intake did not commit after a panic")
	}
}
