package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
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
// ends), the execution lingering on an empty lane yields after its first
// slice, and another one follows it.
func TestDrainerKeepsItsLaneWhileNobodyWaits(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	cfg, listens := channelsTo(t, newPartner(t, "", nil))
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { holdLimits(o, time.Minute) })
	send(t, listens[0], adt("W0", "P1"))
	fixtures.Eventually(t, 30*time.Second, "W0 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 1 })
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
	cfg, listens := channelsTo(t, newPartners(t, 2)...)
	cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		holdLimits(o, time.Hour)
		o.IngressWorkers = 1
	})
	send(t, listens[0], adt("W0", "P1"))
	fixtures.Eventually(t, 30*time.Second, "W0 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 1 })
	sent := time.Now()
	send(t, listens[1], adt("W1", "P1"))
	fixtures.Eventually(t, 10*time.Second, "W1 processed while c0's drainer holds the only ingress slot", func() bool {
		return countStatus(t, db, pipeline.StatusProcessed) == 2
	})
	t.Logf("W1 processed %v after it was sent", time.Since(sent).Round(time.Millisecond))
	for i := range 2 {
		if got := queryInt(t, db, `SELECT count(*)::int FROM mefor_message WHERE control_id = $1`, fmt.Sprintf("W%d", i)); got != 1 {
			t.Errorf("W%d stored %d times, want once", i, got)
		}
	}
}

// A drainer whose slice ends while it lingers on a lane that had work in
// this execution yields (a snooze of zero: its job stays live) instead of
// completing, so the lane's next message finds a live drainer and intake
// stores it in one trip, as the message before it. Completing there made
// every busy lane's drainer, at the end of its hold, hand the next message
// to an intake that had to insert a new drainer, announce it and wait for
// the announcement's commit, while every message stored with it waited
// too. A lane that stays quiet still
// completes its drainer: the next execution served nothing when its slice
// ends.
func TestDrainerYieldsALaneInUseAtTheEndOfItsSlice(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	cfg, listens := channelsTo(t, p)
	cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		// No extension (the hold is one slice), and a linger longer than
		// the test: only the end of a slice can end an execution.
		o.Limits.Slice = 200 * time.Millisecond
		o.Limits.Hold = o.Limits.Slice
		o.Limits.Linger = time.Minute
	})
	const n = 30
	var want []string
	for i := range n {
		id := fmt.Sprintf("Y%02d", i)
		want = append(want, id)
		send(t, listens[0], adt(id, "P1"))
		time.Sleep(50 * time.Millisecond) // ~10 slices of traffic
	}
	fixtures.Eventually(t, 30*time.Second, "every message delivered", func() bool { return len(p.acceptedIDs()) == n })
	if got := p.acceptedIDs(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partner got %v, want %v", got, want)
	}
	// One drainer job for c0's ingress lane over ten slices of traffic:
	// each execution yielded, none completed for the next message to
	// start another.
	if got := queryInt(t, db, `SELECT count(*)::int FROM river_job WHERE queue = $1`, jobs.QueueIngress); got != 1 {
		t.Errorf("c0's ingress lane had %d drainer jobs over ten slices of traffic, want 1 (each execution yielding)", got)
	}
	fixtures.Eventually(t, 10*time.Second, "c0's quiet ingress lane completes its drainer", func() bool {
		return queryInt(t, db, `SELECT count(*)::int FROM river_job WHERE queue = $1 AND state <> 'completed'`, jobs.QueueIngress) == 0
	})
}
