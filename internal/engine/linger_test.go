package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/store"
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

// A drainer woken on its lingering lane waits Limits.Gather before it
// reads, so that what is committed in that moment is handed on together
// (docs/ARCHITECTURE.md, "Idle cost"); a drainer that starts on a quiet
// lane reads at once.
func TestWokenDrainerGathersRowsCommittedMeanwhile(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "")
	listen := freeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s"}
`, p.addr))
	// Long, so that a gather cannot pass unnoticed, nor a message sent in
	// the middle of one miss it.
	const gather = 3 * time.Second
	startNode(t, db, cfg, func(o *engine.Options) {
		o.Limits.Linger = time.Minute
		o.Limits.Gather = gather
	})

	start := time.Now()
	send(t, listen, adt("G1", "P1"))
	eventually(t, 30*time.Second, "G1 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "G1") })
	if took := time.Since(start); took >= gather {
		t.Fatalf("G1 took %s to cross three quiet lanes: a drainer that starts must not gather (gather %s)", took, gather)
	}

	// The three drainers linger now. G2 wakes the route drainer, and G3
	// is committed while it gathers.
	send(t, listen, adt("G2", "P1"))
	time.Sleep(300 * time.Millisecond)
	send(t, listen, adt("G3", "P1"))
	eventually(t, 30*time.Second, "G2 and G3 delivered", func() bool { return len(p.acceptedIDs()) == 3 })
	if got := p.acceptedIDs(); !slices.Equal(got, []string{"G1", "G2", "G3"}) {
		t.Fatalf("partner accepted %v, want G1 G2 G3 in order", got)
	}
	// Events are inserted by the hand-off that records them and never
	// updated, so their xmin is that hand-off's transaction.
	for _, ev := range []string{store.EventRouted, store.EventTransformed} {
		n := queryInt(t, db, `SELECT count(DISTINCT e.xmin::text)::int FROM mefor_event e
			JOIN mefor_message m ON m.id = e.message_id WHERE e.event = $1 AND m.control_id IN ('G2', 'G3')`, ev)
		if n != 1 {
			t.Errorf("G2 and G3 got their %s events in %d transactions, want one hand-off for both", ev, n)
		}
	}
}
