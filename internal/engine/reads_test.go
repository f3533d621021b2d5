package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Lane reads and idle cost: a lingering drainer does not poll its lane, a
// light lane is read about once per message, the reads of drainers woken
// together share a round trip, and a woken drainer waits to gather rows
// only while the CPUs are short.

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
	// Long, so the drainers still linger after a slow delivery on a loaded machine.
	const linger = 15 * time.Second
	n, p, listen := startDownstream(t, db, nil, func(o *engine.Options) {
		o.Limits.Linger = linger
		o.Limits.Poll = 20 * time.Millisecond // what a poll would be, were there one
		o.ReclaimInterval = time.Hour         // its sweep reads mefor_work too
	})

	send(t, listen, adt("L1", "P1"))
	fixtures.Eventually(t, 10*time.Second, "L1 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "L1") })
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
	other := &engine.Intake{Pool: db.Pool, Inserter: n.Client(), Logger: fixtures.Logger(t)}
	if _, err := other.Receive(context.Background(), "adt", "test", "", adt("L2", "P1")); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 3*linger, "L2 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "L2") })
}

// A drainer woken on its lingering lane waits Limits.Gather before it
// reads when it expects another row within that time and the host's CPUs
// are contended, so that what is committed in that moment is handed on
// together (docs/ARCHITECTURE.md, "Idle cost"); with CPU to spare it reads
// at once, and so does a drainer that starts on a quiet lane.
func TestWokenDrainerGathersRowsCommittedMeanwhileOnlyUnderContention(t *testing.T) {
	t.Parallel()
	for _, contended := range []bool{true, false} {
		t.Run(fmt.Sprintf("contended=%v", contended), func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			// Long, so that a gather cannot pass unnoticed, nor a message
			// sent in the middle of one miss it; a row every 300ms is then
			// plenty of company.
			const gather = 3 * time.Second
			node, p, listen := startDownstream(t, db, nil, func(o *engine.Options) {
				o.Limits.Linger = time.Minute
				o.Limits.Gather = gather
				o.Contended = func() bool { return contended }
			})

			start := time.Now()
			send(t, listen, adt("G1", "P1"))
			fixtures.Eventually(t, 30*time.Second, "G1 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "G1") })
			if took := time.Since(start); took >= gather {
				t.Fatalf("G1 took %s to cross three quiet lanes: a drainer that starts must not gather (gather %s)", took, gather)
			}

			// The drainers linger now. G2 gives the route drainer a rate
			// (it read G1 when it started, which counts for none); G3
			// wakes it again, and G4 is committed while it gathers, if it
			// does.
			for _, id := range []string{"G2", "G3", "G4"} {
				send(t, listen, adt(id, "P1"))
				time.Sleep(300 * time.Millisecond)
			}
			fixtures.Eventually(t, 30*time.Second, "G2 to G4 delivered", func() bool { return len(p.acceptedIDs()) == 4 })
			if got := p.acceptedIDs(); !slices.Equal(got, []string{"G1", "G2", "G3", "G4"}) {
				t.Fatalf("partner accepted %v, want G1 to G4 in order", got)
			}
			want := 2 // with CPU to spare, each is handed on as it comes
			if contended {
				want = 1
			}
			// Events are inserted by the hand-off that records them and
			// never updated, so their xmin is that hand-off's transaction.
			n := queryInt(t, db, `SELECT count(DISTINCT e.xmin::text)::int FROM mefor_event e
				JOIN mefor_message m ON m.id = e.message_id WHERE e.event = $1 AND m.control_id IN ('G3', 'G4')`, pipeline.EventRouted)
			if n != want {
				t.Errorf("G3 and G4 were routed in %d transactions, want %d", n, want)
			}
			// Operators see the gathers, and the gauge that allows them.
			fams := gatherMetrics(t, node)
			gathers := value(fams, "mefor_drainer_gathers_total", "stage", "ingress")
			if contended && gathers < 1 {
				t.Errorf("mefor_drainer_gathers_total{stage=ingress} = %v, want at least 1", gathers)
			}
			if !contended && gathers != -1 {
				t.Errorf("mefor_drainer_gathers_total{stage=ingress} = %v without contention, want no sample", gathers)
			}
			wantGauge := 0.0
			if contended {
				wantGauge = 1
			}
			if got := value(fams, "mefor_cpu_contended"); got != wantGauge {
				t.Errorf("mefor_cpu_contended = %v, want %v", got, wantGauge)
			}
		})
	}
}

// laneReads counts the drainers' reads of their lanes (pipeline.PendingRows).
type laneReads struct {
	tripCounter
	n atomic.Int64
}

func (r *laneReads) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if strings.Contains(data.SQL, "FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id") {
		r.n.Add(1)
	}
}

// A lightly loaded interface, one message at a time with its drainers
// lingering in between, costs each stage about one read of its lane per
// message: the read that finds the message. A drainer that has served all
// that a read found waits to be woken instead of reading again at once,
// which before found the lane empty every time and doubled the reads.
func TestLightLaneReadOncePerMessage(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	tracer := &laneReads{}
	// The drainers stay through the whole run.
	listen, p := startTracedNode(t, db, tracer, 3*time.Second)

	const n = 10
	var want []string
	for i := range n {
		id := fmt.Sprintf("L%d", i)
		want = append(want, id)
		send(t, listen, adt(id, "P1"))
		fixtures.Eventually(t, 10*time.Second, id+" delivered", func() bool { return slices.Contains(p.acceptedIDs(), id) })
	}
	if got := firstDeliveries(p.acceptedIDs()); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	// Three stages, one read each per message, and a little slack for a
	// wake that lands while a stage is between its read and its hand-off.
	reads := tracer.n.Load()
	t.Logf("%d lane reads for %d messages", reads, n)
	if reads > 3*n+6 {
		t.Errorf("%d lane reads for %d messages through 3 stages, want at most %d", reads, n, 3*n+6)
	}
}

// Drainers of several lanes woken while a lane read is in flight read
// their lanes together, in one round trip, once it ends; each lane still
// delivers its own messages, in order, once. With reads alone, the other
// lanes do not wait for the read held.
func TestLaneReadsOfSeveralLanesShareARoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		alone bool
	}{{"shared", false}, {"alone", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			partners := newPartners(t, 4)
			cfg, listens := channelsTo(t, partners...)
			n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
				o.Limits.Linger = time.Minute // every drainer lingers through the test
				o.ReadsAlone = tc.alone
			})
			for i, l := range listens {
				send(t, l, adt(fmt.Sprintf("W%d", i), "P1"))
			}
			fixtures.Eventually(t, 30*time.Second, "W0 to W3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 4 })

			// The next read (c0's ingress drainer, woken by S0) is held.
			s0 := newGate(t)
			defer s0.let()
			var mu sync.Mutex
			var turns []int
			engine.SetReadHook(n, func(reads int) {
				mu.Lock()
				turns = append(turns, reads)
				mu.Unlock()
				s0.hold()
			})
			send(t, listens[0], adt("S0", "P1"))
			if !tc.alone {
				<-s0.arrived
			}
			for i := 1; i < 4; i++ {
				send(t, listens[i], adt(fmt.Sprintf("S%d", i), "P1"))
			}
			if tc.alone {
				fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed, nobody waiting", func() bool {
					return countStatus(t, db, pipeline.StatusProcessed) == 8
				})
			} else {
				fixtures.Eventually(t, 30*time.Second, "S1 to S3's reads waiting for S0's", func() bool { return engine.WaitingReads(n) == 3 })
				time.Sleep(100 * time.Millisecond)
				if got := countStatus(t, db, pipeline.StatusProcessed); got != 4 {
					t.Errorf("%d messages processed while the reads waited, want the 4 of the warm-up", got)
				}
				s0.let()
				fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 8 })
			}
			for i, p := range partners {
				if got := p.acceptedIDs(); !slices.Equal(got, []string{fmt.Sprintf("W%d", i), fmt.Sprintf("S%d", i)}) {
					t.Errorf("d%d's partner accepted %v, want W%d then S%d once each", i, got, i, i)
				}
			}
			if tc.alone {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if len(turns) < 2 || turns[0] != 1 || turns[1] != 3 {
				t.Errorf("read turns carried %v lanes, want S0's alone, then S1 to S3's together", turns)
			}
			if shared := value(gatherMetrics(t, n), "mefor_lane_reads_shared_total", "stage", "ingress"); shared < 3 {
				t.Errorf("mefor_lane_reads_shared_total{stage=ingress} = %v, want at least the 3 shared reads", shared)
			}
		})
	}
}
