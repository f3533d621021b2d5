package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// Crashes: a drainer whose node died or that River superseded, and a
// PostgreSQL server that crashed mid-stream. No ACKed message is lost, a
// superseded execution records nothing, a crash counts once against the
// head it may have killed, and no more sends repeat than the open record
// window.

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
	cfg := testConfig(t, listen, mllpDest("downstream", partnerAddr, "connect_timeout: 200ms", "retry: {backoff: 100ms, max_backoff: 100ms}"))
	limits := workers.DefaultLimits
	limits.Batch, limits.MaxRows = 1, 2 // each execution serves two rows, then yields
	a := cluster.Start(t, engine.Options{Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "a", Limits: limits})
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

// PostgreSQL crashes mid-stream (a server process is SIGKILLed, so the
// postmaster resets shared memory and recovers from the WAL, losing what
// sat in its WAL buffers). The sender, a real interface, resends whatever
// got no ACK. Every ACKed message must still reach the partner, in order,
// and no more sends may repeat than the open record window plus the
// message stored whose ACK the crash cut off. A commit that returned
// before its WAL was flushed (synchronous_commit off, for intake as a
// mutant, or for every session on this server without
// dbpool.DurableCommits) loses ACKed messages here.
func TestDatabaseCrashLosesNoAcknowledgedMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testcontainers.NewServer(t)
	db, err := srv.CreateDB(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Pool.Close)
	// The suite's server commits without waiting for the flush, as a
	// careless production server might; the node's sessions must not
	// (dbpool.DurableCommits).

	// The partner holds one delivery until the crash is over, so that no
	// delivery record flushes the WAL meanwhile: only intake's commits do.
	hold := newGate(t)
	const window = 4
	_, p, listen := startDownstream(t, db, holdFirst(hold, "DC0020"), nil,
		"retry: {backoff: 100ms, max_backoff: 500ms}", fmt.Sprintf("record_batch: {rows: %d, window: 50ms}", window))

	// The crash lands while the sender streams: the messages ACKed just
	// before it are in the WAL buffers unless their commit flushed them.
	const total, crashAt = 300, 80
	var acked atomic.Int32
	crashed := make(chan error, 1)
	go func() {
		for acked.Load() < crashAt {
			time.Sleep(time.Millisecond)
		}
		crashed <- crashServer(db)
	}()
	var ids []string
	resends := 0
	for i := range total {
		id := fmt.Sprintf("DC%04d", i)
		ids = append(ids, id)
		for try := 0; ; try++ {
			ack, err := sendOne(listen, adt(id, "P"+strconv.Itoa(i)))
			if err == nil && ack.Code == hl7.AckAccept {
				break
			}
			if try > 600 {
				t.Fatalf("%s got no ACK in a minute after the crash (last: %v %v)", id, ack.Code, err)
			}
			resends++
			time.Sleep(100 * time.Millisecond)
		}
		acked.Add(1)
	}
	if err := <-crashed; err != nil {
		t.Fatal(err)
	}
	hold.let()
	if resends == 0 {
		t.Fatal("the crash refused no message: it did not happen while messages were in flight")
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		got := firstDeliveries(ours(p.acceptedIDs(), "DC"))
		if len(got) == total {
			if !slices.Equal(got, ids) {
				t.Fatalf("first deliveries out of order:\n got  %v\n want %v", got, ids)
			}
			break
		}
		if time.Now().After(deadline) {
			var missing []string
			for _, id := range ids {
				if !slices.Contains(got, id) {
					missing = append(missing, id)
				}
			}
			t.Fatalf("%d of %d ACKed messages delivered; missing %v", len(got), total, missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Sends repeat only for the open record window at the crash (the held
	// send), and for a message stored whose ACK the crash cut off (one
	// sender: at most one in flight, resent until ACKed).
	got := ours(p.acceptedIDs(), "DC")
	if dups := len(got) - total; dups > window+1 {
		t.Fatalf("%d sends repeated after one database crash, want at most %d: %v", dups, window+1, got)
	}
	t.Logf("one database crash: %d resends by the sender, %d repeated deliveries", resends, len(got)-total)
}

// crashServer SIGKILLs one of db's server processes: the postmaster then
// ends every session and recovers from the WAL, as after a crash, losing
// its WAL buffers. It returns once another session has seen the reset.
func crashServer(db *testcontainers.DB) error {
	ctx := context.Background()
	victim, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	// Referenced to the end: an unreachable connection's socket is closed
	// by its finalizer, and its server process would leave before the kill.
	defer victim.Close(ctx)
	witness, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	defer witness.Close(ctx)
	var pid int
	if err := victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	code, out, err := db.Server.Container().Exec(ctx, []string{"sh", "-c", "kill -KILL " + strconv.Itoa(pid)})
	if err != nil || code != 0 {
		var msg []byte
		if out != nil {
			msg, _ = io.ReadAll(out)
		}
		return fmt.Errorf("kill server process %d: exit %d, %v: %q", pid, code, err, msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := witness.Exec(ctx, `SELECT 1`); err != nil {
			return nil // the postmaster ended this session too: a crash reset
		}
		if time.Now().After(deadline) {
			return errors.New("the server did not reset after one of its processes was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
