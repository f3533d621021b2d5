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
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
