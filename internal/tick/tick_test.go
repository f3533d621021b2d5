package tick_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/tick"
)

// With its context already ended, Every calls nothing and Now calls once:
// Every waits a period before its first call, Now does not.
func TestFirstCall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var every, now atomic.Int32
	tick.Every(ctx, time.Millisecond, func(context.Context) { every.Add(1) })
	tick.Now(ctx, time.Millisecond, func(context.Context) { now.Add(1) })
	if every.Load() != 0 || now.Load() != 1 {
		t.Fatalf("with the context ended: Every called %d times, Now %d; want 0 and 1", every.Load(), now.Load())
	}
}

// Every keeps calling until its context ends, and then returns.
func TestEveryRepeatsUntilTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick.Every(ctx, time.Millisecond, func(context.Context) { calls.Add(1) })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls within 10s of a 1ms period, want 3", calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every still running 10s after its context ended")
	}
}

// A kick calls at once, without waiting for the period.
func TestEveryOrKickedCallsWhenKicked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kick := make(chan struct{}, 1)
	called := make(chan struct{}, 1)
	go tick.EveryOrKicked(ctx, time.Hour, kick, func(context.Context) { called <- struct{}{} })
	kick <- struct{}{}
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("no call within 10s of a kick, with an hour's period")
	}
}
