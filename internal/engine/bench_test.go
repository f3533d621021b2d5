package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
)

// BenchmarkPipeline measures MLLP in → route → transform → MLLP out through
// a real node and PostgreSQL, next to raw River throughput (no-op jobs) on
// the same database in the same run, so the ratio means something on a
// noisy machine. Run with: task bench (go test -bench=. -benchtime=1x).
func BenchmarkPipeline(b *testing.B) {
	scenarios := []struct {
		name     string
		lanes    int     // channels, each with its own fifo destination: lanes per stage
		conns    int     // sender connections per channel
		messages int     // total messages
		rate     float64 // offered msgs/s in total; 0 = as fast as ACKs allow
		handler  benchHandler
		// encrypted runs the node with a keyring: every body, payload and
		// reply sealed at rest (compare with fifo-1lane of the same run).
		encrypted bool
	}{
		{name: "fifo-1lane", lanes: 1, conns: 4, messages: 4000},
		{name: "fifo-1lane-encrypted", lanes: 1, conns: 4, messages: 4000, encrypted: true},
		{name: "fifo-8lanes", lanes: 8, conns: 1, messages: 8000},
		{name: "ack-at-500rps", lanes: 1, conns: 4, messages: 2500, rate: 500},
		{name: "js-1lane", lanes: 1, conns: 4, messages: 4000, handler: jsBenchHandler},
	}
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				r := runPipelineScenario(b, sc.lanes, sc.conns, sc.messages, sc.rate, sc.handler, sc.encrypted)
				b.ReportMetric(r.msgsPerSec, "msgs/s")
				b.ReportMetric(r.ackP50, "ack_p50_ms")
				b.ReportMetric(r.ackP99, "ack_p99_ms")
				b.ReportMetric(r.riverNoop, "river_noop_jobs/s")
				fmt.Printf("BENCH %s msgs_per_s=%.0f ack_p50_ms=%.2f ack_p99_ms=%.2f river_noop_jobs_per_s=%.0f\n",
					sc.name, r.msgsPerSec, r.ackP50, r.ackP99, r.riverNoop)
			}
		})
	}
}

type scenarioResult struct {
	msgsPerSec, ackP50, ackP99, riverNoop float64
}

func runPipelineScenario(b *testing.B, lanes, conns, messages int, rate float64, handler benchHandler, encrypted bool) scenarioResult {
	db := testcontainers.NewDB(b)
	p := newPartner(b, "")
	defer p.stop()

	routeHandler, extra := "passthrough", ""
	if handler != nil {
		routeHandler, extra = handler(b, db)
	}
	var y strings.Builder
	y.WriteString("cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}\nchannels:\n")
	listens := make([]string, lanes)
	for i := range lanes {
		listens[i] = freeAddr(b)
		fmt.Fprintf(&y, "  ch%d:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, handler: %s, destinations: [d%d]}\n", i, listens[i], routeHandler, i)
	}
	y.WriteString(extra)
	y.WriteString("destinations:\n")
	for i := range lanes {
		fmt.Fprintf(&y, "  d%d: {type: mllp, mllp: {address: %q}}\n", i, p.addr)
	}
	cfg, err := config.Parse(filepath.Join(b.TempDir(), "bench.yaml"), []byte(y.String()), nil)
	if err != nil {
		b.Fatalf("bench config: %v", err)
	}
	var kr *crypt.Keyring
	if encrypted {
		key := make([]byte, crypt.KeySize)
		rand.Read(key)
		if kr, err = crypt.Parse("bench=" + base64.StdEncoding.EncodeToString(key)); err != nil {
			b.Fatal(err)
		}
	}
	startNode(b, db, cfg, func(o *engine.Options) { o.Keys = kr })

	perConn := messages / (lanes * conns)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(lanes*conns) / rate)
	}
	latencies := make([][]time.Duration, lanes*conns)
	var wg sync.WaitGroup
	var failed atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for i := range lanes * conns {
		wg.Go(func() {
			c := &mllp.Client{Addr: listens[i%lanes], AckTimeout: 30 * time.Second}
			defer c.Close()
			next := time.Now()
			for j := range perConn {
				if interval > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(interval)
				}
				msg := adt(fmt.Sprintf("B%d-%d", i, j), fmt.Sprintf("P%d", j))
				t0 := time.Now()
				raw, err := c.Send(context.Background(), msg)
				latencies[i] = append(latencies[i], time.Since(t0))
				if ack, perr := hl7.ParseACK(raw); err != nil || perr != nil || ack.Code != hl7.AckAccept {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	total := perConn * lanes * conns
	for len(p.acceptedIDs()) < total {
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("only %d of %d delivered after 10 minutes", len(p.acceptedIDs()), total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d messages not acknowledged AA", failed.Load())
	}

	all := slices.Concat(latencies...)
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return scenarioResult{
		msgsPerSec: float64(total) / elapsed.Seconds(),
		ackP50:     ms(all[len(all)/2]),
		ackP99:     ms(all[len(all)*99/100]),
		riverNoop:  riverNoopThroughput(b, db, 10000),
	}
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.done.Add(1)
	return nil
}

// riverNoopThroughput inserts n no-op jobs and measures how fast a River
// client on the same database works them off: the floor the pipeline's
// per-message database work is compared against.
func riverNoopThroughput(b *testing.B, db *testcontainers.DB, n int) float64 {
	ctx := context.Background()
	var done atomic.Int64
	w := river.NewWorkers()
	river.AddWorker(w, &noopWorker{done: &done})
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{
		Queues:            map[string]river.QueueConfig{"bench": {MaxWorkers: 100}},
		Workers:           w,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            testLogger(b),
	})
	if err != nil {
		b.Fatal(err)
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}, InsertOpts: &river.InsertOpts{Queue: "bench"}}
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := client.InsertManyFastTx(ctx, tx, params)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for done.Load() < int64(n) {
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	_ = client.Stop(ctx)
	return float64(n) / elapsed.Seconds()
}
