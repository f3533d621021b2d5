package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
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

// gatherMetrics reads the node's registry as a scrape would.
func gatherMetrics(t *testing.T, n *engine.Node) map[string]*dto.MetricFamily {
	t.Helper()
	list, err := n.Metrics().Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, f := range list {
		fams[f.GetName()] = f
	}
	return fams
}
