package workers

import (
	"context"
	"testing"
	"time"
)

// The estimate counts what each read found over the time since the one
// before; the rows a drainer finds when it starts are backlog, not a rate.
func TestArrivalsFromReads(t *testing.T) {
	var a arrivals
	t0 := time.Unix(1_000_000, 0)
	a.read(t0, 50)
	if got := a.expected(time.Second); got != 0 {
		t.Fatalf("after the first read: %.1f rows expected in 1s, want 0", got)
	}
	a.read(t0.Add(10*time.Millisecond), 1) // 100/s
	if got := a.expected(time.Second); got < 99 || got > 101 {
		t.Fatalf("one row in 10ms: %.1f rows expected in 1s, want 100", got)
	}
	// A pause lowers it, but one pause does not erase it.
	a.read(t0.Add(110*time.Millisecond), 0)
	if got := a.expected(time.Second); got < 70 || got > 80 {
		t.Fatalf("after an empty read 100ms later: %.1f rows expected in 1s, want 75", got)
	}
	var none *arrivals
	if none.expected(time.Second) != 0 {
		t.Fatal("no estimate expects rows")
	}
}

// A woken drainer waits only when it expects company and the CPUs are
// contended; otherwise it reads at once.
func TestGatherWaitsOnlyForExpectedCompanyUnderContention(t *testing.T) {
	const gather = time.Second
	dense := arrivals{perSec: 10, samples: 3}   // 10 rows within a gather
	sparse := arrivals{perSec: 0.5, samples: 3} // one every 2s
	for _, c := range []struct {
		name      string
		contended bool
		rate      arrivals
		wait      bool
	}{
		{"dense, contended", true, dense, true},
		{"dense, CPU to spare", false, dense, false},
		{"sparse, contended", true, sparse, false},
		{"no estimate yet, contended", true, arrivals{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := &Deps{Limits: Limits{Gather: gather}, Contended: func() bool { return c.contended }}
			start := time.Now()
			d.gather(context.Background(), "ingress:adt", &c.rate)
			took := time.Since(start)
			if c.wait && took < gather {
				t.Errorf("returned after %s, want a wait of %s", took, gather)
			}
			if !c.wait && took >= gather/2 {
				t.Errorf("waited %s, want no wait", took)
			}
		})
	}
	// Stopping ends a wait.
	stopping := make(chan struct{})
	close(stopping)
	d := &Deps{Limits: Limits{Gather: time.Hour}, Contended: func() bool { return true }, Stopping: stopping}
	rate := dense
	done := make(chan struct{})
	go func() { d.gather(context.Background(), "ingress:adt", &rate); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a gather went on after the node began to stop")
	}
}
