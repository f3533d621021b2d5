package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// A rescue (the lane's drainer died, maybe mid-send) counts one attempt
// against the lane's head, once. A backlog served over several executions
// after it must not have each execution's first row charged again, or one
// node death would eat the retry budget of many messages.
func TestRescueCountsOneCrashOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	partnerAddr := downAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s", connect_timeout: 200ms}
    retry: {backoff: 100ms, max_backoff: 100ms}
`, partnerAddr))
	limits := workers.DefaultLimits
	limits.Batch, limits.MaxRows = 1, 2 // each execution serves two rows, then yields
	a := startOwnNode(t, engine.Options{Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "a", Limits: limits})
	ids := controlIDs("RC%03d", 6)
	send(t, listen, adts(ids, onePatient)...) // the partner is down: all six queue
	fixtures.Eventually(t, 20*time.Second, "all queued, the head failing", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`) == 6 &&
			queryInt(t, db, `SELECT coalesce(max(attempts), 0) FROM mefor_work WHERE stage = 'outbound'`) >= 1
	})
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Leave the lane as a rescue of a drainer that died mid-send does: the
	// job available again with the rescue recorded (River's rescuer and
	// reclaim both append an error entry and bump river:rescue_count), the
	// rows due.
	fixtures.Exec(t, db, `UPDATE mefor_work SET next_attempt_at = now() - interval '1 second' WHERE status = 'pending'`)
	rescue(t, db, `state = 'available', scheduled_at = now()`, `kind = 'mefor_outbound'`)

	p := newPartner(t, partnerAddr, nil)
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "b"; o.Limits = limits })
	deadline := time.Now().Add(60 * time.Second)
	for len(ours(p.acceptedIDs(), "RC")) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("partner accepted only %v; rows: %v", ours(p.acceptedIDs(), "RC"),
				queryStrings(t, db, `SELECT format('%s %s %s', lane, status, attempts) FROM mefor_work WHERE stage = 'outbound' ORDER BY seq`))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := ours(p.acceptedIDs(), "RC"); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want %v", got, ids)
	}
	crashed := queryStrings(t, db, `SELECT m.control_id FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
		WHERE r.outcome = 'crashed' ORDER BY r.id`)
	if !slices.Equal(crashed, []string{"RC000"}) {
		t.Fatalf("crashed attempts recorded for %v; want one, for the head the dead drainer may have been sending", crashed)
	}
}

// A crash repeats at most the open record window: the drainer records a
// lane's sends once its window holds record_batch rows, before the next
// send, so when the node dies mid-send at most rows sends (the one in
// flight included) are unrecorded, and only those are sent again by the
// execution that takes over, in order, after it counted the crash against
// its head.
func TestCrashRepeatsAtMostTheRecordWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	hold := newGate(t) // the node "dies" while CW005's send is held
	const rows = 4
	logs := newLogWatch(fixtures.Logger(t).Handler(), "drainer superseded")
	n, p, listen := startDownstream(t, db, holdFirst(hold, "CW005"), func(o *engine.Options) {
		o.Logger = slog.New(logs)
		o.ReclaimInterval = time.Hour // the test decides when the lane is served again
	}, fmt.Sprintf("record_batch: {rows: %d, window: 1s}", rows))
	waitStartupReclaim(t, db)
	ids := controlIDs("CW%03d", 8)
	send(t, listen, adts(ids, onePatient)...)
	hold.wait(t, "CW005")
	// A window closes at its fourth send (or after a second), so with the
	// sixth send in flight at least two are recorded (four, unless the
	// machine is slow).
	const sent = 6
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`); got < sent-rows {
		t.Fatalf("%d deliveries recorded with the sixth send in flight; want at least %d (a window closes at record_batch rows)", got, sent-rows)
	}

	// The node dies: the job is rescued as River's rescuer and reclaim do
	// (an error entry, river:rescue_count bumped), not yet fetched again.
	jobID := runningOutbound(t, db)
	rescue(t, db, `state = 'retryable', scheduled_at = now() + interval '1 hour'`, `id = $1`, jobID)
	hold.let()
	fixtures.Eventually(t, 20*time.Second, "the dead execution to stop", func() bool { return logs.count("drainer superseded") > 0 })
	recorded := queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`)
	if recorded < sent-rows || recorded > sent {
		t.Fatalf("%d deliveries recorded after the crash; want at least %d", recorded, sent-rows)
	}
	// Superseded rather than killed, it went on to the end of its open
	// window, which it could not record either.
	unrecorded := len(p.receivedIDs()) - recorded
	if unrecorded > rows {
		t.Fatalf("the dead execution sent %d messages it did not record; a window holds at most %d", unrecorded, rows)
	}
	// River's completer settles the dead execution's end (a no-op on a job
	// that is not running) within its 50ms tick; retrying the job before
	// that would let it complete the new execution instead.
	time.Sleep(time.Second)
	if _, err := n.Client().JobRetry(ctx, jobID); err != nil {
		t.Fatal(err)
	}

	fixtures.Eventually(t, 30*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })
	got := p.receivedIDs()
	firsts := firstDeliveries(got)
	if !slices.Equal(firsts, ids) {
		t.Fatalf("partner received %v: first deliveries out of order", got)
	}
	if dups := len(got) - len(firsts); dups > rows {
		t.Fatalf("partner received %v: %d sends repeated after one crash; at most record_batch rows (%d) may be", got, dups, rows)
	}
	if want := append(slices.Clone(ids[:recorded+unrecorded]), ids[recorded:]...); !slices.Equal(got, want) {
		t.Fatalf("partner received %v, want %v: the unrecorded sends again, then the rest", got, want)
	}
	if n := deliveredOnce(t, db); n != len(ids) {
		t.Fatalf("%d messages have exactly one delivered event, want %d", n, len(ids))
	}
	crashed := queryStrings(t, db, `SELECT m.control_id FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
		WHERE r.outcome = 'crashed' ORDER BY r.id`)
	if !slices.Equal(crashed, ids[recorded:recorded+1]) {
		t.Fatalf("crashed attempts recorded for %v; want one, for the head of the lost window", crashed)
	}
}
