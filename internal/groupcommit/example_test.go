package groupcommit_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/mefor/mefor/internal/groupcommit"
)

// Callers that arrive while a commit is in flight share the next one. A lone
// caller commits at once. Here a commit is held open until two more callers
// have queued behind it; the older of them then commits both items in one
// batch, and the other returns with its item committed.
func ExampleGroup() {
	ctx := context.Background()
	var g groupcommit.Group[string]
	// A real commit function writes items in one transaction and records
	// each one's outcome in the item (T is usually a pointer).
	commit := func(ctx context.Context, items []string) { fmt.Println("commit", items) }

	g.Do(ctx, "a", commit) // nobody committing: commits alone, at once

	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	do := func(item string, commit func(context.Context, []string)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Do(ctx, item, commit)
		}()
	}
	do("b", func(ctx context.Context, items []string) {
		commit(ctx, items)
		close(started)
		<-release // a slow commit: c and d arrive meanwhile
	})
	<-started
	for i, item := range []string{"c", "d"} {
		do(item, commit)
		for g.Waiting() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	close(release)
	wg.Wait()
	// Output:
	// commit [a]
	// commit [b]
	// commit [c d]
}
