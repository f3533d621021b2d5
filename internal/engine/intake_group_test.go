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
