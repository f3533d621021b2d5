package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
