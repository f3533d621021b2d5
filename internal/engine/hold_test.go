package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/testcontainers"
)

// holdLimits are drainer limits with a short slice and a longer hold, and
// drainers that linger through the test.
func holdLimits(o *engine.Options, hold time.Duration) {
	o.Limits.Slice = 200 * time.Millisecond
	o.Limits.Hold = hold
	o.Limits.Linger = time.Minute
}

// ingressExecution is the attempted_at of the running drainer of c0's
// ingress lane, "" when none runs.
func ingressExecution(t *testing.T, db *testcontainers.DB, channel string) string {
	t.Helper()
	got := queryStrings(t, db, `SELECT coalesce(j.attempted_at::text, '') FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = $1 AND j.state = 'running'`, "ingress:"+channel)
	if len(got) == 0 {
		return ""
	}
	return got[0]
}

// A drainer whose slice ends while no other drainer of its queue waits for
// a worker slot keeps its lane, slice after slice, up to Limits.Hold: its
// execution is the same after many slices. Without the look (a slice always
// ends), the execution lingering on an empty lane completes after its
// first slice.
func TestDrainerKeepsItsLaneWhileNobodyWaits(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	cfg, listens := channelsToPartners(t, []string{newPartner(t, "").addr})
	startNode(t, db, cfg, func(o *engine.Options) { holdLimits(o, time.Minute) })
	send(t, listens[0], adt("W0", "P1"))
	eventually(t, 30*time.Second, "W0 processed", func() bool { return countStatus(t, db, store.StatusProcessed) == 1 })
	first := ingressExecution(t, db, "c0")
	if first == "" {
		t.Fatal("no drainer runs on c0's ingress lane after W0")
	}
	time.Sleep(1500 * time.Millisecond) // 7 slices
	if now := ingressExecution(t, db, "c0"); now != first {
		t.Errorf("c0's ingress drainer after 7 slices: execution %q, want still %q", now, first)
	}
}

// One ingress worker and two channels: the drainer holding the only slot
// gives it up at the end of its slice because the other channel's drainer
// waits for it, so the other channel's message is routed within a few
// slices, not after the hold.
func TestDrainerGivesItsSlotToOneWaiting(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	cfg, listens := channelsToPartners(t, []string{newPartner(t, "").addr, newPartner(t, "").addr})
	startNode(t, db, cfg, func(o *engine.Options) {
		holdLimits(o, time.Hour)
		o.IngressWorkers = 1
	})
	send(t, listens[0], adt("W0", "P1"))
	eventually(t, 30*time.Second, "W0 processed", func() bool { return countStatus(t, db, store.StatusProcessed) == 1 })
	sent := time.Now()
	send(t, listens[1], adt("W1", "P1"))
	eventually(t, 10*time.Second, "W1 processed while c0's drainer holds the only ingress slot", func() bool {
		return countStatus(t, db, store.StatusProcessed) == 2
	})
	t.Logf("W1 processed %v after it was sent", time.Since(sent).Round(time.Millisecond))
	for i := range 2 {
		if got := queryInt(t, db, `SELECT count(*)::int FROM mefor_message WHERE control_id = $1`, fmt.Sprintf("W%d", i)); got != 1 {
			t.Errorf("W%d stored %d times, want once", i, got)
		}
	}
}
