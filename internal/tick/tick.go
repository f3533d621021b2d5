// Package tick runs a function periodically until its context ends: the
// loops behind heartbeats, watchdogs, pollers and caches that refresh.
package tick

import (
	"context"
	"time"
)

// Every calls f every d until ctx ends, the first time once d has passed.
// A call that takes longer than d delays the next (ticks do not pile up).
func Every(ctx context.Context, d time.Duration, f func(context.Context)) {
	EveryOrKicked(ctx, d, nil, f)
}

// EveryOrKicked is Every that also calls f as soon as kick receives, for a
// loop a notification can hurry. A nil kick never does.
func EveryOrKicked(ctx context.Context, d time.Duration, kick <-chan struct{}, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		f(ctx)
	}
}

// Now calls f at once, then every d until ctx ends.
func Now(ctx context.Context, d time.Duration, f func(context.Context)) {
	f(ctx)
	Every(ctx, d, f)
}
