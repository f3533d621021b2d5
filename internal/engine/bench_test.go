package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/cpupressure"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkPipeline measures MLLP in → route → transform → MLLP out through
// a real `mefor run` subprocess and PostgreSQL, next to raw River
// throughput (no-op jobs) on the same database in the same run, so the
// ratio means something on a noisy machine. Run with: task bench, which
// makes the database durable (docs/performance.md says how to read it).
//
// Every line is
//
//	BENCH <name> msgs_per_s= ack_p50_ms= ack_p99_ms= db_xacts_per_msg= rss_mb= river_noop_jobs_per_s= [extras]
func BenchmarkPipeline(b *testing.B) {
	env := &benchEnv{bin: buildMefor(b, b.TempDir())}
	{
		db := testcontainers.NewDB(b)
		prewarmWAL(context.Background(), b, db)
		fmt.Println(benchDBLine(b, db))
	}
	scenarios := []benchScenario{
		{name: "fifo-1lane", lanes: 1, conns: 4, messages: 4000},
		{name: "fifo-1lane-encrypted", lanes: 1, conns: 4, messages: 4000, encrypted: true},
		{name: "fifo-8lanes", lanes: 8, conns: 1, messages: 8000},
		{name: "ack-at-500rps", lanes: 1, conns: 4, messages: 2500, rate: 500},
		{name: "js-1lane", lanes: 1, conns: 4, messages: 4000, handler: jsBenchHandler},
		// 50 interfaces at 10 msg/s each, 20 s: many lightly loaded lanes.
		{name: "channels-50", lanes: 50, conns: 1, messages: 10000, rate: 500, stagger: true},
		// One interface, one connection: throughput is 1 / ACK round trip.
		{name: "fifo-1conn", lanes: 1, conns: 1, messages: 3000, breakdown: true},
		{name: "idle-50", run: runIdleScenario},
		{name: "backlog-1m", run: runBacklogScenario},
	}
	// MEFOR_BENCH_SCALE=k sends k times each scenario's messages, for a
	// look at a node past the 20 s a scenario runs (drainers yielding their lanes
	// after Limits.Hold, autovacuum on grown tables); the figures the
	// issues' targets name are those of the default, 1.
	if k, err := strconv.Atoi(os.Getenv("MEFOR_BENCH_SCALE")); err == nil && k > 1 {
		for i := range scenarios {
			scenarios[i].messages *= k
		}
	}
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				run := sc.run
				if run == nil {
					run = runPipelineScenario
				}
				r := run(b, env, sc)
				b.ReportMetric(r.msgsPerSec, "msgs/s")
				b.ReportMetric(r.ackP50, "ack_p50_ms")
				b.ReportMetric(r.ackP99, "ack_p99_ms")
				b.ReportMetric(r.riverNoop, "river_noop_jobs/s")
				line := fmt.Sprintf("BENCH %s msgs_per_s=%.0f ack_p50_ms=%.2f ack_p99_ms=%.2f db_xacts_per_msg=%.2f rss_mb=%.1f river_noop_jobs_per_s=%.0f",
					sc.name, r.msgsPerSec, r.ackP50, r.ackP99, r.xactsPerMsg, r.rssMB, r.riverNoop)
				for _, e := range r.extras {
					line += " " + e
				}
				fmt.Println(line)
			}
		})
	}
}

type benchEnv struct {
	bin string // the mefor binary the scenarios run
}

type benchScenario struct {
	name     string
	lanes    int     // channels, each with its own fifo destination: lanes per stage
	conns    int     // sender connections per channel
	messages int     // total messages
	rate     float64 // offered msgs/s in total, paced per connection; 0 = as fast as ACKs allow
	handler  benchHandler
	// encrypted runs the node with a keyring: every body, payload and
	// reply sealed at rest (compare with fifo-1lane of the same run).
	encrypted bool
	// stagger spreads the paced connections' phases over one interval;
	// without it every connection sends at the same tick.
	stagger bool
	// breakdown adds the parts of one ACK round trip (fifo-1conn).
	breakdown bool
	// run replaces the traffic scenario (idle-50, backlog-1m).
	run func(b *testing.B, env *benchEnv, sc benchScenario) scenarioResult
}

type scenarioResult struct {
	msgsPerSec, ackP50, ackP99 float64
	xactsPerMsg, rssMB         float64
	riverNoop                  float64
	extras                     []string // "key=value", printed after the fixed fields
}

// pipelineYAML is a config of lanes channels, channel i listening on
// listens[i] and routing to its own fifo destination d<i> at partner.
func pipelineYAML(lanes int, listens []string, routeHandler, extra, partner string) string {
	var y strings.Builder
	y.WriteString("channels:\n")
	for i := range lanes {
		fmt.Fprintf(&y, "  ch%d:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, handler: %s, destinations: [d%d]}\n", i, listens[i], routeHandler, i)
	}
	y.WriteString(extra)
	y.WriteString("destinations:\n")
	for i := range lanes {
		fmt.Fprintf(&y, "  d%d: {type: mllp, mllp: {address: %q}}\n", i, partner)
	}
	return y.String()
}

func runPipelineScenario(b *testing.B, env *benchEnv, sc benchScenario) scenarioResult {
	db := testcontainers.NewDB(b)
	stm := newStatements(b, db)
	p := newPartner(b, "", nil)
	defer p.stop()

	routeHandler, extra := "passthrough", ""
	if sc.handler != nil {
		routeHandler, extra = sc.handler(b, db)
	}
	listens := make([]string, sc.lanes)
	for i := range listens {
		listens[i] = fixtures.FreeAddr(b)
	}
	yaml := pipelineYAML(sc.lanes, listens, routeHandler, extra, p.addr)
	if _, err := config.Parse(filepath.Join(b.TempDir(), "bench.yaml"), []byte(yaml), nil); err != nil {
		b.Fatalf("bench config: %v", err)
	}
	var keySpec string
	var keyEnv []string
	if sc.encrypted {
		key := make([]byte, crypt.KeySize)
		rand.Read(key)
		keySpec = "bench=" + base64.StdEncoding.EncodeToString(key)
		keyEnv = append(keyEnv, crypt.EnvKeys+"="+keySpec)
	}

	// From before the node starts to after its sessions ended: the node's
	// start and stop (a few dozen transactions) are counted with the
	// traffic, and no transaction is missed by pg_stat_database's lazy
	// per-session flush.
	x0 := xactCommits(b, db, db.Name)
	node := startNodeProc(b, env.bin, db, yaml, listens, keyEnv...)
	stm.reset(b)
	cpu0 := node.stats(b).cpu
	pg0, pgOK := serverCPU(b, db)

	walReady := walReadyMB(context.Background(), b, db)
	stall0, stallErr := cpupressure.Stalled(cpupressure.DefaultPath)
	b.ResetTimer()
	tr := drive(b, listens, sc, p, 0)
	b.StopTimer()
	stall1, _ := cpupressure.Stalled(cpupressure.DefaultPath)

	st := node.stats(b)
	pg1, _ := serverCPU(b, db)
	split := node.intakeSplit(b)
	node.stop(b)
	waitSessionsGone(b, db)
	x1 := xactCommits(b, db, db.Name)

	r := scenarioResult{
		msgsPerSec:  float64(tr.total) / tr.elapsed.Seconds(),
		ackP50:      ms(percentile(tr.latencies, 50)),
		ackP99:      ms(percentile(tr.latencies, 99)),
		xactsPerMsg: float64(x1-x0) / float64(tr.total),
		rssMB:       st.hwmMB,
	}
	if stallErr == nil {
		r.extras = append(r.extras, fmt.Sprintf("cpu_stall_pct=%.1f", 100*float64(stall1-stall0)/float64(tr.elapsed)))
	}
	r.extras = append(r.extras, split...)
	if len(tr.firsts) >= 8 {
		// Where many senders start at once, their first ACKs wait for the
		// lanes' activation: how the start weighs in ack_p99_ms.
		r.extras = append(r.extras, fmt.Sprintf("first_ack_p50_ms=%.1f", ms(percentile(tr.firsts, 50))),
			fmt.Sprintf("first_ack_max_ms=%.1f", ms(tr.firsts[len(tr.firsts)-1])))
	}
	if len(tr.byWindow) >= 5 {
		// A scenario that sends long enough to show whether its tail is
		// the node's start, something periodic, or its steady state.
		var ws []string
		for _, d := range tr.byWindow {
			ws = append(ws, fmt.Sprintf("%.1f", ms(d)))
		}
		r.extras = append(r.extras, "ack_p99_ms_by_second="+strings.Join(ws, ","))
	}
	r.extras = append(r.extras, fmt.Sprintf("node_cpu_us_per_msg=%.0f", float64((st.cpu-cpu0).Microseconds())/float64(tr.total)))
	if pgOK {
		r.extras = append(r.extras, fmt.Sprintf("pg_cpu_us_per_msg=%.0f", float64((pg1-pg0).Microseconds())/float64(tr.total)))
	}
	if w := stm.wal(b); stm != nil {
		n := float64(tr.total)
		r.extras = append(r.extras, fmt.Sprintf("wal_fsyncs_per_msg=%.2f", float64(w.syncs)/n),
			fmt.Sprintf("wal_fsync_us=%.0f", float64(w.syncMean)/float64(time.Microsecond)),
			fmt.Sprintf("wal_bytes_per_msg=%.0f", float64(w.bytes)/n),
			fmt.Sprintf("wal_fpi_per_msg=%.2f", float64(w.fullPages)/n),
			fmt.Sprintf("wal_ready_mb=%d", walReady),
			fmt.Sprintf("blks_per_msg=%.0f", float64(stm.blocks(b))/n))
	}
	top := stm.top(b, 15)
	if top != nil {
		writeProfileFile(b, sc.name+".pg_stat_statements.txt",
			formatStatements(fmt.Sprintf("%s: top 15 statements by execution and planning time, %d messages", sc.name, tr.total), top, 300))
	}
	if sc.breakdown {
		r.extras = append(r.extras, ackBreakdown(b, stm)...)
	}
	if profileDir() != "" {
		profileInProcess(b, db, yaml, keySpec, listens, sc, p)
	}
	r.riverNoop = riverNoopThroughput(b, db, 10000)
	return r
}

// traffic is what one scenario's senders saw.
type traffic struct {
	latencies []time.Duration // every ACK round trip, sorted
	// byWindow is the ACK p99 of each second of sending, in order (the
	// first holds the node's warm-up: drainers activated, sessions
	// planning their statements).
	byWindow []time.Duration
	// firsts are the ACKs of each sender's first message, sorted: on a
	// node that just started, each activates its lanes.
	firsts  []time.Duration
	total   int
	elapsed time.Duration // first send to last delivery
}

// drive runs the scenario's synchronous senders (send, wait for the ACK,
// send the next) and waits until the partner accepted every message.
// seqBase keeps control ids unique when one partner sees two runs.
func drive(b *testing.B, listens []string, sc benchScenario, p *partner, seqBase int) traffic {
	b.Helper()
	return driveLabelled(b, listens, sc, p, seqBase, func(f func()) { f() })
}

// driveLabelled is drive with each sender goroutine run through wrap (to
// label it in a CPU profile).
func driveLabelled(b *testing.B, listens []string, sc benchScenario, p *partner, seqBase int, wrap func(func())) traffic {
	b.Helper()
	lanes, conns := sc.lanes, sc.conns
	perConn := sc.messages / (lanes * conns)
	var interval time.Duration
	if sc.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(lanes*conns) / sc.rate)
	}
	before := len(p.acceptedIDs())
	latencies := make([][]time.Duration, lanes*conns)
	sentAt := make([][]time.Duration, lanes*conns) // since start
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := time.Now()
	for i := range lanes * conns {
		wg.Go(func() {
			wrap(func() {
				c := &mllp.Client{Addr: listens[i%lanes], AckTimeout: 30 * time.Second}
				defer c.Close()
				next := time.Now()
				if sc.stagger {
					// Independent interfaces are not in phase: spread the
					// connections' first sends over one interval.
					next = next.Add(interval * time.Duration(i) / time.Duration(lanes*conns))
				}
				for j := range perConn {
					if interval > 0 {
						time.Sleep(time.Until(next))
						next = next.Add(interval)
					}
					msg := adt(fmt.Sprintf("B%d-%d-%d", seqBase, i, j), fmt.Sprintf("P%d", j))
					t0 := time.Now()
					raw, err := c.Send(context.Background(), msg)
					latencies[i] = append(latencies[i], time.Since(t0))
					sentAt[i] = append(sentAt[i], t0.Sub(start))
					if ack, perr := hl7.ParseACK(raw); err != nil || perr != nil || ack.Code != hl7.AckAccept {
						failed.Add(1)
					}
				}
			})
		})
	}
	wg.Wait()
	total := perConn * lanes * conns
	for len(p.acceptedIDs())-before < total {
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("only %d of %d delivered after 10 minutes", len(p.acceptedIDs())-before, total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if failed.Load() > 0 {
		b.Fatalf("%d messages not acknowledged AA", failed.Load())
	}
	var windows [][]time.Duration
	for i := range latencies {
		for j, d := range latencies[i] {
			w := int(sentAt[i][j] / time.Second)
			for len(windows) <= w {
				windows = append(windows, nil)
			}
			windows[w] = append(windows[w], d)
		}
	}
	var byWindow []time.Duration
	for _, w := range windows {
		slices.Sort(w)
		byWindow = append(byWindow, percentile(w, 99))
	}
	all := slices.Concat(latencies...)
	slices.Sort(all)
	var firsts []time.Duration
	for _, l := range latencies {
		if len(l) > 0 {
			firsts = append(firsts, l[0])
		}
	}
	slices.Sort(firsts)
	return traffic{latencies: all, total: total, elapsed: elapsed, byWindow: byWindow, firsts: firsts}
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

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
		Logger:            fixtures.Logger(b),
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
