package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The lane protocol: one drainer per lane delivers in commit order, no
// lane is left with backlog and no live drainer, a drainer that snoozes or
// yields is served again without waiting for River's poll, and a drainer
// keeps its lane and worker slot only while nobody waits for them.

// Messages sent at once by many senders, each on its own connection, reach a
// fifo destination in the order their intake transactions committed, each
// exactly once, and every sender's own messages in the order it sent them.
func TestFIFOManyProducersDeliverInCommitOrder(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	// Without linger a drainer completes as soon as its lane runs dry.
	_, p, listen := startDownstream(t, db, nil, func(o *engine.Options) { o.Limits.Linger = 0 })

	// Waves: every sender sends one message at the same moment into idle
	// lanes, so each wave races its intake transactions against the
	// activation and first reads of a new drainer, which is when commit
	// order and seq order would part without the lane lock.
	const producers, waves = 16, 10
	clients := make([]*mllp.Client, producers)
	for g := range clients {
		clients[g] = &mllp.Client{Addr: listen, AckTimeout: 20 * time.Second}
		defer clients[g].Close()
	}
	for w := range waves {
		var wg sync.WaitGroup
		errs := make(chan error, producers)
		start := make(chan struct{})
		for g, c := range clients {
			wg.Go(func() {
				<-start
				id := fmt.Sprintf("G%02dM%03d", g, w)
				raw, err := c.Send(context.Background(), adt(id, fmt.Sprintf("P%d", g)))
				if err != nil {
					errs <- fmt.Errorf("sender %d message %d: %w", g, w, err)
					return
				}
				if ack, err := hl7.ParseACK(raw); err != nil || ack.Code != hl7.AckAccept {
					errs <- fmt.Errorf("sender %d message %d: ack %v %v", g, w, ack.Code, err)
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		fixtures.Eventually(t, 30*time.Second, "lanes idle after the wave", func() bool { return liveDrainers(t, db) == 0 })
	}

	total := producers * waves
	fixtures.Eventually(t, 60*time.Second, "all messages delivered", func() bool { return len(p.receivedIDs()) >= total })
	want := commitOrder(t, db, "adt")
	if len(want) != total {
		t.Fatalf("%d ingress rows, want %d", len(want), total)
	}
	got := p.acceptedIDs()
	if !slices.Equal(got, want) {
		t.Fatalf("partner received messages out of commit order or not exactly once:\n first difference at %d\n got  %v\n want %v",
			firstDiff(got, want), window(got, firstDiff(got, want)), window(want, firstDiff(got, want)))
	}
	// Each sender's messages in its own sending order: implied by commit
	// order, checked to state what a sender sees.
	for g := range producers {
		var mine []string
		for _, id := range got {
			if strings.HasPrefix(id, fmt.Sprintf("G%02dM", g)) {
				mine = append(mine, id)
			}
		}
		if !slices.IsSorted(mine) || len(mine) != waves {
			t.Fatalf("producer %d's messages arrived as %v", g, mine)
		}
	}
	fixtures.Eventually(t, 20*time.Second, "all messages processed", func() bool { return countStatus(t, db, "processed") == total })
}

// A lane whose drainer keeps completing (no linger) while producers keep
// adding to it never ends up with backlog and no drainer: at no instant does a
// lane hold pending rows without a live drainer job, everything is delivered
// once, and when traffic stops no drainer is left behind. Reclaim is switched
// off, so only the enqueuer/drainer protocol can keep lanes served.
func TestNoStrandedBacklogUnderBurstyTraffic(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	n, p, _ := startDownstream(t, db, nil, func(o *engine.Options) {
		o.Limits.Linger = 0 // complete as soon as the lane is empty: the race under test
		o.ReclaimInterval = time.Hour
	})
	waitStartupReclaim(t, db)

	// Watch the invariant the whole time.
	ctx, stopWatch := context.WithCancel(context.Background())
	var watchErr atomic.Value
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			lanes, err := strandedLanes(ctx, db)
			if err == nil && len(lanes) > 0 {
				watchErr.Store(fmt.Sprintf("lanes %v have pending rows and no live drainer", lanes))
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	const rounds, producers, perBurst = 25, 4, 3
	rng := rand.New(rand.NewPCG(1, 2))
	gaps := make([][]time.Duration, rounds*producers)
	for i := range gaps {
		for range perBurst {
			gaps[i] = append(gaps[i], time.Duration(rng.IntN(4000))*time.Microsecond)
		}
	}
	sent := 0
	for r := range rounds {
		var wg sync.WaitGroup
		var failed atomic.Value
		for g := range producers {
			wg.Go(func() {
				for i, gap := range gaps[r*producers+g] {
					time.Sleep(gap)
					id := fmt.Sprintf("R%02dG%dM%d", r, g, i)
					if _, err := n.Intake().Receive(context.Background(), "adt", "test", "", adt(id, "P1")); err != nil {
						failed.Store(err)
					}
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			t.Fatalf("receive: %v", err)
		}
		sent += producers * perBurst
		// Let the round settle so its drainers complete before the next
		// burst races with them; a round that does not settle is stranded.
		deadline := time.Now().Add(20 * time.Second)
		for len(p.acceptedIDs()) < sent {
			if msg := watchErr.Load(); msg != nil {
				t.Fatalf("round %d: %s", r, msg)
			}
			if time.Now().After(deadline) {
				stranded, _ := strandedLanes(context.Background(), db)
				t.Fatalf("round %d: %d of %d messages delivered; stranded lanes %v", r, len(p.acceptedIDs()), sent, stranded)
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}
	stopWatch()
	<-watched
	if msg := watchErr.Load(); msg != nil {
		t.Fatal(msg)
	}

	got := p.acceptedIDs()
	if want := commitOrder(t, db, "adt"); !slices.Equal(got, want) {
		t.Fatalf("delivered %d messages not once each in commit order (first difference at %d)", len(got), firstDiff(got, want))
	}
	// The partner has ACKed the last send; its record commits just after.
	fixtures.Eventually(t, 10*time.Second, "no work row left pending", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'pending'`) == 0
	})
	fixtures.Eventually(t, 20*time.Second, "no live drainer left", func() bool { return liveDrainers(t, db) == 0 })
	fixtures.Eventually(t, 10*time.Second, "all messages processed", func() bool { return countStatus(t, db, "processed") == sent })
}

// firstDiff is the first index where a and b differ.
func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// window shows a few elements around i.
func window(s []string, i int) []string {
	return s[max(0, i-3):min(len(s), i+4)]
}

// parkedLane starts a node whose fifo destination answers AE to the first
// attempt of head and retries only after a minute, so the lane's drainer is
// parked (snoozed, state scheduled) behind its head while the test works on
// it. It returns the node, the partner and the address to send to.
func parkedLane(t *testing.T, db *testcontainers.DB, head string) (*engine.Node, *partner, string) {
	t.Helper()
	n, p, listen := startDownstream(t, db, failFirst(head, 1, hl7.AckError), nil, "retry: {backoff: 1m}")
	send(t, listen, adt(head, "P1"))
	fixtures.Eventually(t, 20*time.Second, "the drainer parked behind its failed head", func() bool {
		_, attempts, _, err := tryOutboundRow(db, head)
		return err == nil && attempts == 1 && len(queryStrings(t, db, `
			SELECT j.state::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
			WHERE l.name = 'outbound:downstream' AND j.state = 'scheduled'`)) == 1
	})
	return n, p, listen
}

// laneJob returns the drainer job recorded for a lane, its state and the
// transaction id that last wrote its river_job row.
func laneJob(t *testing.T, db *testcontainers.DB, lane string) (id int64, state, xmin string) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `
		SELECT j.id, j.state::text, j.xmin::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = $1`, lane).Scan(&id, &state, &xmin)
	if err != nil {
		t.Fatalf("drainer of lane %s: %v", lane, err)
	}
	return id, state, xmin
}

// unpark makes the parked head due now and wakes its drainer, as an
// operator retrying the destination would.
func unpark(t *testing.T, db *testcontainers.DB) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `
		UPDATE mefor_work SET next_attempt_at = clock_timestamp()
		WHERE lane = 'outbound:downstream' AND status = 'pending'`); err != nil {
		t.Fatal(err)
	}
}

// Enqueueing into a lane whose drainer is live costs no write to the
// drainer's river_job row: 50 messages queued behind a parked drainer leave
// that row untouched (same xmin), and no second drainer appears. They are
// then all delivered, in order, by that drainer.
func TestEnqueueIntoLiveLaneDoesNotWriteDrainerJob(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	n, p, listen := parkedLane(t, db, "A000")
	const lane = "outbound:downstream"
	jobID, _, xmin := laneJob(t, db, lane)

	ids := controlIDs("A%03d", 51) // A000 is the parked head
	send(t, listen, adts(ids[1:], onePatient)...)
	fixtures.Eventually(t, 30*time.Second, "50 messages queued behind the head", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE lane = $1 AND status = 'pending'`, lane) == len(ids)
	})

	gotID, state, gotXmin := laneJob(t, db, lane)
	if gotID != jobID || state != "scheduled" {
		t.Fatalf("lane drainer is job %d (%s), want the parked job %d", gotID, state, jobID)
	}
	if gotXmin != xmin {
		t.Fatalf("queueing 50 messages wrote the live drainer's river_job row (xmin %s -> %s)", xmin, gotXmin)
	}
	if k := queryInt(t, db, `SELECT count(*) FROM river_job WHERE kind = 'mefor_outbound'`); k != 1 {
		t.Fatalf("%d outbound drainer jobs, want the one parked", k)
	}

	unpark(t, db)
	if _, err := n.Client().JobRetry(context.Background(), jobID); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "all delivered", func() bool { return len(p.acceptedIDs()) == len(ids) })
	if got := p.acceptedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want %v", got, ids)
	}
}

// A lane left with backlog and no live drainer (its job cancelled,
// discarded, or already deleted) is found by the reclaim periodic job, which
// River's leader runs, and is served again in order.
func TestReclaimRevivesLaneWithoutDrainer(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		kill func(t *testing.T, n *engine.Node, db *testcontainers.DB, jobID int64)
	}{
		{"cancelled", func(t *testing.T, n *engine.Node, _ *testcontainers.DB, jobID int64) {
			if _, err := n.Client().JobCancel(context.Background(), jobID); err != nil {
				t.Fatal(err)
			}
		}},
		{"discarded", func(t *testing.T, _ *engine.Node, db *testcontainers.DB, jobID int64) {
			if _, err := db.Pool.Exec(context.Background(),
				`UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, jobID); err != nil {
				t.Fatal(err)
			}
		}},
		{"deleted", func(t *testing.T, _ *engine.Node, db *testcontainers.DB, jobID int64) {
			if _, err := db.Pool.Exec(context.Background(), `DELETE FROM river_job WHERE id = $1`, jobID); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			n, p, listen := parkedLane(t, db, "K000")
			send(t, listen, adt("K001", "P1"), adt("K002", "P1"))
			const lane = "outbound:downstream"
			fixtures.Eventually(t, 20*time.Second, "messages queued behind the head", func() bool {
				return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE lane = $1 AND status = 'pending'`, lane) == 3
			})
			jobID, _, _ := laneJob(t, db, lane)
			tc.kill(t, n, db, jobID)
			unpark(t, db)
			if live := queryInt(t, db, `SELECT count(*) FROM river_job WHERE id = $1 AND state IN `+liveJobStates, jobID); live != 0 {
				t.Fatalf("drainer job %d is still live", jobID)
			}

			fixtures.Eventually(t, 30*time.Second, "the stranded lane served again", func() bool { return len(p.acceptedIDs()) == 3 })
			if got := p.acceptedIDs(); !slices.Equal(got, []string{"K000", "K001", "K002"}) {
				t.Fatalf("partner accepted %v, want [K000 K001 K002]", got)
			}
			var newJob int64
			if err := db.Pool.QueryRow(context.Background(),
				`SELECT job_id FROM mefor_lane WHERE name = $1`, lane).Scan(&newJob); err != nil || newJob == jobID {
				t.Fatalf("lane drainer %d (%v), want a new job, not %d", newJob, err, jobID)
			}
			// Reclaim is River's periodic job: enqueued by River's elected
			// leader (this node, the only one) and worked like any job.
			leader := queryStrings(t, db, `SELECT leader_id FROM river_leader`)
			if !slices.Equal(leader, []string{t.Name()}) {
				t.Fatalf("River leader %v, want this node %q", leader, t.Name())
			}
			fixtures.Eventually(t, 10*time.Second, "a reclaim job completed on this node", func() bool {
				return queryInt(t, db, `SELECT count(*) FROM river_job WHERE kind = 'mefor_reclaim'
					AND state = 'completed' AND $1 = ANY(attempted_by)`, t.Name()) > 0
			})
		})
	}
}

// A drainer that yields its lane, or snoozes until a retry is due, is
// served again without waiting for River's poll: the node announces the
// snooze once River has recorded it. Here the poll is an hour and every
// drainer yields after each row (MaxRows 1), at every stage; R1's first
// delivery is answered AE and retried 200 ms later. Announced, everything
// arrives, in order, R1 twice; unannounced, the lanes stop at their first
// yield.
func TestSnoozedDrainersAreAnnounced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wake bool
	}{{"announced", true}, {"unannounced", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			_, p, listen := startDownstream(t, db, failFirst("R1", 1, hl7.AckError), func(o *engine.Options) {
				o.StageQueuePoll = time.Hour
				o.Limits.MaxRows = 1
				o.Limits.Linger = time.Minute // no drainer completes: each goes on only by its snooze
				o.NoSnoozeWake = !tc.wake
			}, "retry: {backoff: 200ms, max_backoff: 200ms}")
			want := []string{"M1", "M2", "R1", "M3"}
			for _, id := range want {
				send(t, listen, adt(id, "P1"))
			}
			if !tc.wake {
				time.Sleep(3 * time.Second)
				if got := p.acceptedIDs(); len(got) == len(want) {
					t.Fatalf("unannounced, with River's poll an hour, the lanes went on past their yields: %v", got)
				}
				return
			}
			fixtures.Eventually(t, 30*time.Second, "all four delivered", func() bool { return len(p.acceptedIDs()) == len(want) })
			if got := fmt.Sprint(p.acceptedIDs()); got != fmt.Sprint(want) {
				t.Errorf("accepted %s, want %v", got, want)
			}
			if got, want := fmt.Sprint(p.receivedIDs()), "[M1 M2 R1 R1 M3]"; got != want {
				t.Errorf("received %s, want %s (R1 retried once)", got, want)
			}
		})
	}
}

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
