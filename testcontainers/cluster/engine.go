package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// StartNode runs a node in this process on db with cfg until the test ends,
// with NodeOptions.
func StartNode(t testing.TB, db *testcontainers.DB, cfg *config.Config, mod func(*engine.Options)) *engine.Node {
	t.Helper()
	return Start(t, NodeOptions(t, db, cfg, mod))
}

// NodeOptions are the options of a node on db with cfg for a test, named
// after the test. mod, when not nil, changes them.
func NodeOptions(t testing.TB, db *testcontainers.DB, cfg *config.Config, mod func(*engine.Options)) engine.Options {
	opts := engine.Options{
		Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: t.Name(),
		ReclaimInterval: time.Second,
		Limits:          workers.DefaultLimits,
		// Drainers gather only on a host short of CPU, and the machine
		// running the suite is short of it in some moments and not in
		// others. A test's timing (which messages share a record window,
		// a hand-off) must not depend on that; the gather's own test
		// decides the answer itself.
		Contended: func() bool { return false },
		// The API's reads, as `mefor run` gives them.
		APIReads: ops.APIReads{Pool: db.Pool},
	}
	if mod != nil {
		mod(&opts)
	}
	return opts
}

// Start runs a node in this process with opts as they are, until the test
// ends: it is stopped then, unless the test stopped it itself.
func Start(t testing.TB, opts engine.Options) *engine.Node {
	t.Helper()
	n, err := engine.New(opts)
	if err != nil {
		t.Fatalf("new node: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Stop(context.Background()); err != nil {
			t.Logf("stop node: %v", err)
		}
	})
	return n
}
