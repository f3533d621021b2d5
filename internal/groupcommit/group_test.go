package groupcommit

import (
	"context"
	"testing"
	"time"
)

type item struct{ committed int }

// A caller that finds nobody committing commits at once, alone; callers
// arriving while that commit is in flight wait, and the first of them then
// commits them all in one batch.
func TestLeaderTakesWhatQueued(t *testing.T) {
	t.Parallel()
	var g Group[*item]
	started := make(chan int, 4)
	release := make(chan struct{})
	commit := func(_ context.Context, batch []*item) {
		started <- len(batch)
		<-release
		for _, it := range batch {
			it.committed++
		}
	}
	do := func() <-chan *item {
		out := make(chan *item, 1)
		go func() {
			it := &item{}
			g.Do(context.Background(), it, commit)
			out <- it
		}()
		return out
	}
	lone := do()
	select {
	case n := <-started:
		if n != 1 {
			t.Fatalf("lone caller's commit carried %d items, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone caller's commit did not start: it waits for company")
	}
	later := []<-chan *item{do(), do()}
	for g.Waiting() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if n := <-started; n != 2 {
		t.Fatalf("the commit after the first carried %d items, want the 2 that queued", n)
	}
	for _, ch := range append(later, lone) {
		if it := <-ch; it.committed != 1 {
			t.Fatalf("caller returned after %d commits of its item, want 1", it.committed)
		}
	}
	if n := g.Waiting(); n != 0 || g.busy {
		t.Fatalf("after all commits: busy %v, %d queued", g.busy, n)
	}
}

// Max cuts what queued into commits of at most Max items, oldest first.
func TestMaxBoundsACommit(t *testing.T) {
	t.Parallel()
	g := Group[int]{Max: 2}
	release := make(chan struct{})
	started := make(chan struct{})
	var sizes [][]int
	commit := func(_ context.Context, batch []int) {
		sizes = append(sizes, batch) // commits never overlap
		if batch[0] == 0 {
			close(started)
			<-release
		}
	}
	done := make(chan struct{}, 4)
	go func() { g.Do(context.Background(), 0, commit); done <- struct{}{} }()
	<-started
	for i := 1; i <= 3; i++ {
		go func() { g.Do(context.Background(), i, commit); done <- struct{}{} }()
		for g.Waiting() < i {
			time.Sleep(time.Millisecond)
		}
	}
	close(release)
	for range 4 {
		<-done
	}
	if len(sizes) != 3 || len(sizes[1]) != 2 || len(sizes[2]) != 1 || sizes[1][0] != 1 || sizes[2][0] != 3 {
		t.Fatalf("commits %v, want [0] [1 2] [3]", sizes)
	}
}
