package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
)

// workScans is how often mefor_work has been read, as far as the server's
// statistics have been flushed (each backend flushes about once a second).
func workScans(t *testing.T, db *testcontainers.DB) int {
	return queryInt(t, db, `SELECT (coalesce(seq_scan, 0) + coalesce(idx_scan, 0))::int FROM pg_stat_user_tables WHERE relname = 'mefor_work'`)
}

// A drainer waiting on its caught-up lane does not read the lane while it
// waits: this node's commits wake it, and work committed elsewhere (here an
// intake that wakes nobody, as another node's would) is found when the
// wait ends, by the locked look that would otherwise complete the drainer.
func TestLingeringDrainersDoNotPoll(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "")
	listen := freeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s"}
`, p.addr))
	// Long, so the drainers still linger after a slow delivery on a loaded machine.
	const linger = 15 * time.Second
	n := startNode(t, db, cfg, func(o *engine.Options) {
		o.Limits.Linger = linger
		o.Limits.Poll = 20 * time.Millisecond // what a poll would be, were there one
		o.ReclaimInterval = time.Hour         // its sweep reads mefor_work too
	})

	send(t, listen, adt("L1", "P1"))
	eventually(t, 10*time.Second, "L1 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "L1") })
	if got := liveDrainers(t, db); got != 3 {
		t.Fatalf("%d live drainers after the delivery, want the 3 of the lanes L1 passed, lingering", got)
	}
	// The scans of the hand-offs themselves are flushed by now.
	time.Sleep(1500 * time.Millisecond)
	before := workScans(t, db)
	time.Sleep(2 * time.Second)
	if got := liveDrainers(t, db); got != 3 {
		t.Fatalf("%d live drainers in the middle of the linger, want 3", got)
	}
	// Polling every 20ms, three lanes would read it ~300 times in 2s.
	if scans := workScans(t, db) - before; scans > 10 {
		t.Errorf("mefor_work read %d times in 2s by lingering drainers and nothing else", scans)
	}

	// Work no one woke them for is still served, within the linger.
	other := &engine.Intake{Pool: db.Pool, Inserter: n.Client(), Logger: testLogger(t)}
	if _, err := other.Receive(context.Background(), "adt", "test", "", adt("L2", "P1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*linger, "L2 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "L2") })
}
