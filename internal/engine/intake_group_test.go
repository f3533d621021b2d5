package engine

import (
	"context"
	"testing"
	"time"
)

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
	queueLen := g.g.Waiting
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
