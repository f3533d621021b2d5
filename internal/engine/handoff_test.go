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
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Hand-off transactions: the route hand-offs and delivery records of
// several lanes that come together share a transaction, one lane cannot
// hold up the others for long, and each transaction runs with the
// pipeline's plan settings.

// Route hand-offs of several lanes that arrive while another is in flight
// share the next transaction; without sharing each takes its own. A
// hand-off in flight holds the others at most their patience, and one
// stuck on a lock not even that long: its transaction gives up on the lock
// and it waits for it alone.
//
// Channel c0's route hand-off (S0) is held in flight, either in the group's
// turn (a hook that blocks it) or on its lane (a transaction of the test's
// holding c0's routed lane); meanwhile c1 to c3 each get a message, whose
// route hand-offs (S1 to S3) come while it is held.
func TestHandoffsArrivingTogetherShareATransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts func(*engine.Options)
		// hook: S0 is held by the group's hook rather than its lane lock.
		hook bool
		// shared: S1 to S3 are routed in one transaction once S0 goes on;
		// otherwise they are delivered while S0 is held.
		shared bool
		// routed is how many transactions route S1 to S3 (0: any number;
		// held on its lane, S0 leaves the group after its lock wait, and
		// whether S1 to S3 then share depends on when each came).
		routed int
	}{
		{"shared", func(o *engine.Options) { o.HandoffPatience = time.Minute }, true, true, 1},
		{"patience", func(o *engine.Options) { o.HandoffPatience = 200 * time.Millisecond }, true, false, 3},
		{"lock", func(o *engine.Options) { o.HandoffPatience = time.Minute }, false, false, 0},
		{"alone", func(o *engine.Options) { o.HandoffsAlone = true }, false, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testcontainers.NewDB(t)
			p := newPartner(t, "", nil)
			cfg, listens := channelsTo(t, p, p, p, p)
			n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
				o.Limits.Linger = time.Minute // every drainer lingers through the test
				tc.opts(o)
			})
			// Start every lane's drainers.
			for i, l := range listens {
				send(t, l, adt(fmt.Sprintf("W%d", i), "P1"))
			}
			fixtures.Eventually(t, 30*time.Second, "W0 to W3 delivered", func() bool { return len(p.acceptedIDs()) == 4 })
			fixtures.Eventually(t, 30*time.Second, "W0 to W3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 4 })

			s0 := newGate(t)
			defer s0.let()
			if tc.hook {
				engine.SetHandoffHook(n, func(int) { s0.hold() })
				send(t, listens[0], adt("S0", "P1"))
				<-s0.arrived
			} else {
				hold, err := db.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := jobs.LockLanes(ctx, hold, []string{jobs.RoutedLane("c0")}); err != nil {
					t.Fatal(err)
				}
				go func() { <-s0.release; hold.Rollback(ctx) }() // also when the test fails
				send(t, listens[0], adt("S0", "P1"))
				fixtures.Eventually(t, 30*time.Second, "S0's route hand-off waiting for its lane", func() bool {
					return queryInt(t, db, `SELECT count(*)::int FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%'`) > 0
				})
			}
			for i := 1; i < 4; i++ {
				send(t, listens[i], adt(fmt.Sprintf("S%d", i), "P1"))
			}
			delivered := func() bool {
				got := p.acceptedIDs()
				return slices.Contains(got, "S1") && slices.Contains(got, "S2") && slices.Contains(got, "S3")
			}
			if tc.shared {
				fixtures.Eventually(t, 30*time.Second, "S1 to S3's hand-offs waiting for S0's", func() bool { return engine.WaitingHandoffs(n) == 3 })
			} else {
				// Well before a turn's own time limit (10s), the next bound
				// on a hand-off stuck in the group.
				fixtures.Eventually(t, 5*time.Second, "S1 to S3 delivered while S0's hand-off is held", delivered)
				if slices.Contains(p.acceptedIDs(), "S0") {
					t.Fatal("S0 delivered while its hand-off was held")
				}
			}
			s0.let()
			fixtures.Eventually(t, 30*time.Second, "S0 to S3 delivered", func() bool { return delivered() && slices.Contains(p.acceptedIDs(), "S0") })
			// The partner has them; their records follow its ACKs.
			fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 8 })

			// Events are inserted by the hand-off that records them and
			// never updated, so their xmin is that hand-off's transaction.
			xacts := queryInt(t, db, `SELECT count(DISTINCT e.xmin::text)::int FROM mefor_event e
				JOIN mefor_message m ON m.id = e.message_id WHERE e.event = $1 AND m.control_id IN ('S1', 'S2', 'S3')`, pipeline.EventRouted)
			if tc.routed > 0 && xacts != tc.routed {
				t.Errorf("S1 to S3 were routed in %d transactions, want %d", xacts, tc.routed)
			}
			shared := value(gatherMetrics(t, n), "mefor_handoffs_shared_total", "stage", "ingress")
			if tc.shared && shared < 3 {
				t.Errorf("mefor_handoffs_shared_total{stage=ingress} = %v, want at least the 3 shared", shared)
			}
			// Held on its lane past the turn's lock wait, S0's turn failed,
			// and operators see it.
			failed := value(gatherMetrics(t, n), "mefor_handoff_turns_failed_total")
			if tc.name == "lock" && failed < 1 {
				t.Errorf("mefor_handoff_turns_failed_total = %v after S0's turn gave up on its lane, want at least 1", failed)
			}
			if tc.name == "alone" && shared > 0 {
				t.Errorf("mefor_handoffs_shared_total{stage=ingress} = %v with sharing off", shared)
			}
		})
	}
}

// The delivery records of several destination lanes whose windows close
// while another hand-off is in flight share the next transaction with each
// other: each lane still sent its message alone and in order, and each is
// recorded delivered, but one transaction writes all three records.
//
// d1 to d3 each have a partner that holds its answer to S1 to S3 until the
// test lets it go; meanwhile c0's route hand-off of S0 is held in the
// group's turn by a hook. The three ACKs then come together, and the three
// windows' records queue behind S0's turn.
func TestDeliveryRecordsOfSeveralLanesShareATransaction(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	gate := make(chan struct{})
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	defer openGate()
	var entered atomic.Int32
	partners := newPartners(t, 4)
	for i := range partners {
		if i > 0 {
			partners[i].setAnswer(func(_ context.Context, id string, _ int) hl7.AckCode {
				if strings.HasPrefix(id, "S") {
					entered.Add(1)
					<-gate
				}
				return hl7.AckAccept
			})
		}
	}
	cfg, listens := channelsTo(t, partners...)
	n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		o.Limits.Linger = time.Minute // every drainer lingers through the test
		o.HandoffPatience = time.Minute
	})
	for i, l := range listens {
		send(t, l, adt(fmt.Sprintf("W%d", i), "P1"))
	}
	fixtures.Eventually(t, 30*time.Second, "W0 to W3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 4 })

	for i := 1; i < 4; i++ {
		send(t, listens[i], adt(fmt.Sprintf("S%d", i), "P1"))
	}
	fixtures.Eventually(t, 30*time.Second, "S1 to S3 sent, their partners holding the answers", func() bool { return entered.Load() == 3 })
	s0 := newGate(t)
	defer s0.let()
	engine.SetHandoffHook(n, func(int) { s0.hold() })
	send(t, listens[0], adt("S0", "P1"))
	<-s0.arrived
	openGate()
	fixtures.Eventually(t, 30*time.Second, "S1 to S3's records waiting for S0's hand-off", func() bool { return engine.WaitingHandoffs(n) == 3 })
	s0.let()
	fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 8 })

	for i := 1; i < 4; i++ {
		if got := partners[i].acceptedIDs(); !slices.Equal(got, []string{fmt.Sprintf("W%d", i), fmt.Sprintf("S%d", i)}) {
			t.Errorf("d%d's partner accepted %v, want W%d then S%d once each", i, got, i, i)
		}
	}
	xacts := queryInt(t, db, `SELECT count(DISTINCT e.xmin::text)::int FROM mefor_event e
		JOIN mefor_message m ON m.id = e.message_id WHERE e.event = 'delivered' AND m.control_id IN ('S1', 'S2', 'S3')`)
	if xacts != 1 {
		t.Errorf("S1 to S3's deliveries were recorded in %d transactions, want 1", xacts)
	}
	if shared := value(gatherMetrics(t, n), "mefor_handoffs_shared_total", "stage", "outbound"); shared < 3 {
		t.Errorf("mefor_handoffs_shared_total{stage=outbound} = %v, want at least the 3 shared records", shared)
	}
}

// pipelineTxTracer follows each connection's transaction: whether it began
// with the pipeline's plan settings (pipeline.PipelineTx), which set
// plan_cache_mode in the BEGIN's own round trip. For the workers'
// statements named in marks it counts where they ran: in such a
// transaction, or in any other.
type pipelineTxTracer struct {
	tripCounter                   // the tracer methods it has no use for
	marks       map[string]string // label: a fragment only that statement has

	mu       sync.Mutex
	pipeline map[*pgx.Conn]bool // open transactions: began with the settings
	inTx     map[string]int     // label: executions in a pipeline transaction
	plain    map[string]int     // label: executions in another transaction
}

func newPipelineTxTracer(marks map[string]string) *pipelineTxTracer {
	return &pipelineTxTracer{marks: marks, pipeline: map[*pgx.Conn]bool{}, inTx: map[string]int{}, plain: map[string]int{}}
}

func (p *pipelineTxTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := strings.ToLower(strings.TrimSpace(data.SQL))
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case strings.HasPrefix(sql, "begin"):
		p.pipeline[conn] = strings.Contains(sql, "plan_cache_mode")
	case sql == "commit" || sql == "rollback":
		delete(p.pipeline, conn)
	default:
		p.count(conn, data.SQL)
	}
	return ctx
}

func (p *pipelineTxTracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count(conn, data.SQL)
}

// count files a statement run in a transaction under its label. Outside a
// transaction (a lingering drainer's poll) it is not the transactions'
// concern.
func (p *pipelineTxTracer) count(conn *pgx.Conn, sql string) {
	pipeline, open := p.pipeline[conn]
	if !open {
		return
	}
	for label, mark := range p.marks {
		if !strings.Contains(sql, mark) {
			continue
		}
		if pipeline {
			p.inTx[label]++
		} else {
			p.plain[label]++
		}
	}
}

// The workers' transactions (the route and transform hand-offs, the
// delivery records, the drainer's empty check) run with the pipeline's plan
// settings, as intake and the lane reads do (TestPipelineStatementsPlanOnce,
// drainer): without them every execution of these statements is planned
// again, which cost the server more than running them.
func TestWorkerTransactionsPlanGenerically(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	tracer := newPipelineTxTracer(map[string]string{
		"route hand-off":     "SELECT c.message_id, 'routed', r.lane, r.channel",
		"transform hand-off": "INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, payload)",
		"delivery record":    "UPDATE mefor_work w SET status = 'done', attempts = w.attempts + 1",
		"empty check":        "WHERE lane = $1 AND status = 'pending' ORDER BY seq LIMIT 1",
	})
	listen, p := startTracedNode(t, db, tracer, 100*time.Millisecond)

	want := controlIDs("G%d", 10)
	send(t, listen, adts(want, onePatient)...)
	fixtures.Eventually(t, 20*time.Second, "all delivered", func() bool { return len(firstDeliveries(p.acceptedIDs())) == len(want) })
	fixtures.Eventually(t, 10*time.Second, "the lanes' drainers done", func() bool { return liveDrainers(t, db) == 0 })
	if got := firstDeliveries(p.acceptedIDs()); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}

	tracer.mu.Lock()
	defer tracer.mu.Unlock()
	for label := range tracer.marks {
		if tracer.inTx[label]+tracer.plain[label] == 0 {
			t.Errorf("%s: never ran in a transaction (has its statement changed?)", label)
		}
		if n := tracer.plain[label]; n > 0 {
			t.Errorf("%s: %d of %d executions in a transaction without the pipeline's plan settings",
				label, n, n+tracer.inTx[label])
		}
	}
}
