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
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A drainer execution that River has superseded while it was waiting on a
// partner's ACK must not record that delivery nor deliver anything else: the
// row stays pending for the execution that replaced it, which sends it again
// (the one duplicate fencing allows) and the lane goes on in order, each
// message recorded delivered exactly once.
//
// The superseding is done to the river_job row the way River does it:
//   - "rescued": the rescuer gave up on the execution (state retryable,
//     scheduled in the future) and no node has fetched it again yet;
//   - "refetched": after a rescue another node fetched the job, which is
//     running again with a new attempted_at. The attempt number is the same
//     as before (a snooze gives it back), so only attempted_at tells the
//     executions apart.
//
// The destination records each send on its own (record_batch rows: 1);
// TestFencedRecordWindowRecordsNothing covers a window of several.
func TestFencedDrainerCannotDeliver(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		supersede string
	}{
		{"rescued", `UPDATE river_job SET state = 'retryable', scheduled_at = now() + interval '1 hour' WHERE id = $1`},
		{"refetched", `UPDATE river_job SET attempted_at = attempted_at + interval '1 second' WHERE id = $1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testFencedDrainer(t, tc.supersede, "{rows: 1}", 1)
		})
	}
}

// A superseded execution records nothing of its open record window: the
// sends it made since its last record stay pending, and the execution that
// replaced it sends them again (at most the window's rows: here the
// superseded one holds three sends, the third in flight at the supersede,
// and sends nothing after the window closed).
func TestFencedRecordWindowRecordsNothing(t *testing.T) {
	t.Parallel()
	testFencedDrainer(t, `UPDATE river_job SET attempted_at = attempted_at + interval '1 second' WHERE id = $1`,
		"{rows: 3, window: 1s}", 3)
}

// testFencedDrainer supersedes the lane's drainer while the partner holds
// the ACK of the held-th send (with the sends before it in the open record
// window), then checks that none of them is recorded, nothing more is sent,
// and the replacement delivers everything once more, in order.
func testFencedDrainer(t *testing.T, supersede, recordBatch string, held int) {
	db := testcontainers.NewDB(t)
	ids := controlIDs("F%03d", 4)
	hold := newGate(t)
	logs := newLogWatch(fixtures.Logger(t).Handler(), "drainer superseded")
	n, p, listen := startDownstream(t, db, holdFirst(hold, ids[held-1]), func(o *engine.Options) {
		o.Logger = slog.New(logs)
		o.ReclaimInterval = time.Hour // the test decides when the lane is served again
	}, fmt.Sprintf("record_batch: %s", recordBatch))
	waitStartupReclaim(t, db)
	send(t, listen, adts(ids, onePatient)...)

	hold.wait(t, ids[held-1])
	// The whole backlog is queued behind F000 before the stale execution
	// could act on it.
	fixtures.Eventually(t, 20*time.Second, "all messages queued for delivery", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`) == len(ids)
	})
	jobID := runningOutbound(t, db)
	fixtures.Exec(t, db, supersede, jobID)
	hold.let() // the partner ACKs the held send to the superseded execution

	fixtures.Eventually(t, 20*time.Second, "the superseded execution to act", func() bool {
		status, _, _, err := tryOutboundRow(db, "F000")
		return logs.count("drainer superseded") > 0 || (err == nil && status != "pending") || len(p.receivedIDs()) > held
	})
	// Give a wrongly unfenced execution time to go on to the next message.
	time.Sleep(300 * time.Millisecond)
	for _, id := range ids[:held] {
		if status, attempts, _ := outboundRow(t, db, id); status != "pending" || attempts != 0 {
			t.Fatalf("superseded execution recorded %s: status %s, attempts %d; want pending, 0", id, status, attempts)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`); n != 0 {
		t.Fatalf("superseded execution recorded %d deliveries", n)
	}
	if got := p.receivedIDs(); !slices.Equal(got, ids[:held]) {
		t.Fatalf("partner received %v after the supersede, want only %v, the window's sends", got, ids[:held])
	}

	// Serve the lane again the way it would be: the rescued job is retried;
	// a job the superseded execution left completed is re-activated by the
	// next message.
	state := queryStrings(t, db, `SELECT state::text FROM river_job WHERE id = $1`, jobID)[0]
	switch state {
	case "retryable":
		if _, err := n.Client().JobRetry(context.Background(), jobID); err != nil {
			t.Fatal(err)
		}
	default:
		fixtures.Eventually(t, 10*time.Second, "the superseded job to finish", func() bool {
			return queryStrings(t, db, `SELECT state::text FROM river_job WHERE id = $1`, jobID)[0] == "completed"
		})
		ids = append(ids, "F004")
		send(t, listen, adt("F004", "P1"))
	}
	fixtures.Eventually(t, 30*time.Second, "all delivered", func() bool { return len(p.acceptedIDs()) == len(ids)+held })
	if got, want := p.acceptedIDs(), append(slices.Clone(ids[:held]), ids...); !slices.Equal(got, want) {
		t.Fatalf("partner accepted %v, want %v (the superseded window's sends once more, then in order)", got, want)
	}
	fixtures.Eventually(t, 10*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })
	if deliveredOnce(t, db) != len(ids) || queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`) != len(ids) {
		t.Fatalf("delivered events are not exactly one per message")
	}
}
