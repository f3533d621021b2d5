package engine_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// BenchmarkPipeline's scenarios other than plain throughput: an idle node,
// a large backlog, the javascript handler of the js scenarios, and the
// breakdown and profile of a run.

// runIdleScenario (idle-50): a node with 50 channels and 50 destinations
// and no traffic. After a 5 s settle it measures 20 s of the node's CPU and
// of committed transactions: on the whole server (xacts_per_s, what the
// issue's target counts) and on the bench database alone (db_xacts_per_s:
// the node's own, without autovacuum's visits to the other databases).
func runIdleScenario(b *testing.B, env *benchEnv, sc benchScenario) scenarioResult {
	const lanes, settle, window = 50, 5 * time.Second, 20 * time.Second
	db := testcontainers.NewDB(b)
	stm := newStatements(b, db)
	p := newPartner(b, "", nil)
	defer p.stop()
	listens := make([]string, lanes)
	for i := range listens {
		listens[i] = fixtures.FreeAddr(b)
	}
	node := startNodeProc(b, env.bin, db, pipelineYAML(lanes, listens, "passthrough", "", p.addr), listens)
	time.Sleep(settle)

	stm.reset(b)
	s0, all0, db0, t0 := node.stats(b), xactCommits(b, db, ""), xactCommits(b, db, db.Name), time.Now()
	time.Sleep(window)
	s1, all1, db1, elapsed := node.stats(b), xactCommits(b, db, ""), xactCommits(b, db, db.Name), time.Since(t0)
	top := stm.top(b, 15)
	node.stop(b)
	if top != nil {
		writeProfileFile(b, sc.name+".pg_stat_statements.txt",
			formatStatements(fmt.Sprintf("%s: top 15 statements by execution and planning time over %s idle", sc.name, window), top, 300))
	}
	r := scenarioResult{rssMB: s1.hwmMB}
	r.extras = append(r.extras,
		fmt.Sprintf("cpu_pct=%.2f", 100*(s1.cpu-s0.cpu).Seconds()/elapsed.Seconds()),
		fmt.Sprintf("xacts_per_s=%.1f", float64(all1-all0)/elapsed.Seconds()),
		fmt.Sprintf("db_xacts_per_s=%.1f", float64(db1-db0)/elapsed.Seconds()),
	)
	r.riverNoop = riverNoopThroughput(b, db, 10000)
	return r
}

// runBacklogScenario (backlog-1m): a million deliveries queued for a
// partner that is down. The backlog is bulk-loaded by SQL in the shape the
// engine leaves it (see loadBacklog) while the node runs, since intake at
// the pipeline's rate would take most of an hour. The node's memory is
// read before the load and after it has run against the backlog; the
// operator commands are timed against the database it works on.
func runBacklogScenario(b *testing.B, env *benchEnv, sc benchScenario) scenarioResult {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("MEFOR_BENCH_BACKLOG")); err == nil && v > 0 {
		n = v
	}
	db := testcontainers.NewDB(b)
	stm := newStatements(b, db)
	listen := fixtures.FreeAddr(b)
	yaml := fmt.Sprintf("channels:\n  ch0:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, handler: passthrough, destinations: [d0]}\n"+
		"destinations:\n  d0: {type: mllp, mllp: {address: %q}}\n", listen, downAddr(b))
	node := startNodeProc(b, env.bin, db, yaml, []string{listen})
	time.Sleep(3 * time.Second)
	before := node.stats(b)

	t0 := time.Now()
	loadBacklog(b, db, n)
	load := time.Since(t0)
	// Long enough for the reclaim job to activate the lane and its drainer
	// to try the head against the dead partner, and for the gauges to read
	// the backlog.
	time.Sleep(15 * time.Second)

	// The median of three runs; one run when it is slow anyway (seconds
	// are far outside the targets and repeats would only stretch the run).
	median := func(args ...string) time.Duration {
		ds := []time.Duration{runCLI(b, env.bin, db, args...)}
		if ds[0] > 2*time.Second {
			return ds[0]
		}
		for range 2 {
			ds = append(ds, runCLI(b, env.bin, db, args...))
		}
		slices.Sort(ds)
		return ds[1]
	}
	status := median("status")
	listErr := median("messages", "list", "--status", "error")
	after := node.stats(b)
	var pending int64
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`).Scan(&pending); err != nil {
		b.Fatal(err)
	}
	if pending != int64(n) {
		b.Fatalf("%d deliveries queued after the run, want %d", pending, n)
	}
	node.stop(b)
	waitSessionsGone(b, db)

	r := scenarioResult{rssMB: after.hwmMB}
	r.extras = append(r.extras,
		fmt.Sprintf("backlog=%d", n), fmt.Sprintf("load_s=%.0f", load.Seconds()),
		fmt.Sprintf("rss_before_mb=%.1f", before.hwmMB), fmt.Sprintf("rss_after_mb=%.1f", after.hwmMB),
		fmt.Sprintf("status_ms=%.0f", ms(status)), fmt.Sprintf("list_error_ms=%.0f", ms(listErr)))

	// Each command's SQL on its own, with the node stopped so nothing else
	// runs statements on this database.
	if stm != nil {
		var report strings.Builder
		for _, c := range []struct {
			key  string
			args []string
		}{{"status_sql_ms", []string{"status"}}, {"list_error_sql_ms", []string{"messages", "list", "--status", "error"}}} {
			stm.reset(b)
			runCLI(b, env.bin, db, c.args...)
			top := stm.top(b, 15)
			var sum float64
			for _, st := range top {
				sum += st.totalMS
			}
			r.extras = append(r.extras, fmt.Sprintf("%s=%.1f", c.key, sum))
			report.WriteString(formatStatements(fmt.Sprintf("mefor %s on a backlog of %d: statements by total_exec_time",
				strings.Join(c.args, " "), n), top, 400))
			report.WriteString("\n")
		}
		b.Log("\n" + report.String())
		writeProfileFile(b, sc.name+".pg_stat_statements.txt", report.String())
	}
	r.riverNoop = riverNoopThroughput(b, db, 10000)
	return r
}

// loadBacklog writes n+n/1000 messages received on ch0 over the last few
// hours, in the shape the engine leaves a message whose delivery is
// queued: status routed, its ingress and routed rows done, its outbound
// row to d0 pending with the payload in it. Every 1001st message instead
// failed: status error, its outbound row dead, so `messages list --status
// error` has a thousand to show. Events are not written (no timed command
// reads them). Tables are vacuumed and analyzed afterwards, as autovacuum
// would have done while such a backlog built up; without parallel workers,
// whose shared memory does not fit the container's 64 MB /dev/shm.
func loadBacklog(b *testing.B, db *testcontainers.DB, n int) {
	b.Helper()
	ctx := context.Background()
	m := n + n/1000
	stmts := []string{
		`INSERT INTO mefor_message (channel, received_at, updated_at, source, remote_addr, control_id, message_type,
			trigger_event, sending_app, sending_facility, size, raw, status, error)
		SELECT 'ch0', clock_timestamp() - ($1 - i) * interval '10 ms', clock_timestamp(), 'mllp', '127.0.0.1:40000',
			'BL' || i, 'ADT', 'A01', 'REG', 'HOSP', length(r), convert_to(r, 'UTF8'),
			CASE WHEN i % 1001 = 0 THEN 'error' ELSE 'routed' END,
			CASE WHEN i % 1001 = 0 THEN 'delivery to d0 failed 5 times' END
		FROM generate_series(1, $1::int) AS i,
			LATERAL (SELECT 'MSH|^~\&|REG|HOSP|MEFOR|MEFOR|20240102081500||ADT^A01^ADT_A01|BL' || i || '|P|2.5.1' || chr(13) ||
				'EVN|A01|20240102081500' || chr(13) || 'PID|1||P' || (i % 50000) || '^^^HOSP^MR||DOE^JANE||19800101|F' || chr(13) ||
				'PV1|1|I|3N^301^A' || chr(13) AS r) AS body
		ORDER BY i`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, status, created_at, updated_at, finished_at)
		SELECT id, s.stage, s.stage || ':ch0', 'ch0', s.route, s.handler, 'done', received_at, received_at, received_at
		FROM mefor_message, (VALUES ('ingress', NULL, NULL), ('routed', 'out', 'passthrough')) AS s(stage, route, handler)
		ORDER BY id, s.stage`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, payload, status, attempts,
			last_error, created_at, updated_at, finished_at)
		SELECT id, 'outbound', 'outbound:d0', 'ch0', 'out', 'passthrough', 'd0', raw,
			CASE WHEN status = 'error' THEN 'dead' ELSE 'pending' END, CASE WHEN status = 'error' THEN 5 ELSE 0 END,
			CASE WHEN status = 'error' THEN 'connection refused' END, received_at, received_at,
			CASE WHEN status = 'error' THEN received_at END
		FROM mefor_message ORDER BY id`,
		`INSERT INTO mefor_lane (name, stage) VALUES ('ingress:ch0', 'ingress'), ('routed:ch0', 'routed'), ('outbound:d0', 'outbound')
		ON CONFLICT DO NOTHING`,
		`VACUUM (ANALYZE, PARALLEL 0) mefor_message`,
		`VACUUM (ANALYZE, PARALLEL 0) mefor_work`,
	}
	for _, s := range stmts {
		var err error
		if strings.Contains(s, "$1") {
			_, err = db.Pool.Exec(ctx, s, m)
		} else {
			_, err = db.Pool.Exec(ctx, s)
		}
		if err != nil {
			b.Fatalf("load backlog: %v\n%s", err, s)
		}
	}
}

// ackBreakdown splits one ACK round trip on one connection (issue #16)
// into what can be measured without touching the node:
//   - echo_rtt_us: the same MLLP client against a server that answers a
//     prebuilt ACK at once: framing, loopback socket and wake-ups, both ends;
//   - parse_us, ack_build_us: hl7.Parse and hl7.NewACK of the bench message;
//   - db_receive_us: server-side execution time of the storing statement,
//     from pg_stat_statements (only with MEFOR_PG_STATEMENTS=1); the
//     commit's WAL flush is wal_fsync_us, printed for every scenario
//     (pg_stat_statements does not time the commit itself).
//
// What remains of ack_p50_ms is the node's client side of its database
// round trips (pgx, scheduling) and its other statements.
func ackBreakdown(b *testing.B, stm *statements) []string {
	b.Helper()
	msg := adt("BRK-1", "P1")
	parsed, err := hl7.Parse(msg)
	if err != nil {
		b.Fatal(err)
	}
	canned := hl7.NewACK(parsed, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &mllp.Server{Handler: mllp.HandlerFunc(func(context.Context, []byte, mllp.ConnInfo) []byte { return canned })}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	c := &mllp.Client{Addr: ln.Addr().String(), AckTimeout: 10 * time.Second}
	var rtts []time.Duration
	for range 2000 {
		t0 := time.Now()
		if _, err := c.Send(context.Background(), msg); err != nil {
			b.Fatalf("echo round trip: %v", err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	c.Close()
	slices.Sort(rtts)

	// A plain loop: testing.Benchmark would wait for the running benchmark.
	perOp := func(f func()) float64 {
		const n = 20000
		t0 := time.Now()
		for range n {
			f()
		}
		return float64(time.Since(t0)) / n / float64(time.Microsecond)
	}
	parse := perOp(func() { _, _ = hl7.Parse(msg) })
	build := perOp(func() { hl7.NewACK(parsed, hl7.AckAccept, "", hl7.NewControlID(), time.Now()) })
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	out := []string{
		fmt.Sprintf("echo_rtt_us=%.0f", us(percentile(rtts, 50))),
		fmt.Sprintf("parse_us=%.1f", parse),
		fmt.Sprintf("ack_build_us=%.1f", build),
	}
	if stm == nil {
		return out
	}
	var receive float64
	for _, st := range stm.top(b, 500) {
		if strings.Contains(st.query, "INSERT INTO mefor_message") && st.calls > 100 {
			// Weighted over the statement's entries (pgx may plan it twice).
			receive = st.meanMS
			break
		}
	}
	return append(out, fmt.Sprintf("db_receive_us=%.0f", receive*1000))
}

// profileInProcess (MEFOR_BENCH_PROFILE=dir) runs the scenario once more
// with the node inside the benchmark process, where runtime/pprof can
// profile it without adding anything to the node: every goroutine the node
// starts inherits the label role=node, the senders carry role=sender, and
// the top of the node's own samples goes to <scenario>.node.top.txt (flat)
// and .node.cum.txt (cumulative)
// (garbage collection runs unlabelled and is left out of that top).
func profileInProcess(b *testing.B, db *testcontainers.DB, yaml, keySpec string, listens []string, sc benchScenario, p *partner) {
	b.Helper()
	dir := profileDir()
	cfg, err := config.Parse(filepath.Join(b.TempDir(), "bench.yaml"), []byte(yaml), nil)
	if err != nil {
		b.Fatal(err)
	}
	kr, err := crypt.Parse(keySpec)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var node *engine.Node
	pprof.Do(ctx, pprof.Labels("role", "node"), func(ctx context.Context) {
		node, err = engine.New(engine.Options{Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(b), NodeID: "bench-profile",
			Limits: workers.DefaultLimits, Keys: kr})
		if err == nil {
			err = node.Start(ctx)
		}
	})
	if err != nil {
		b.Fatalf("start the profiled node: %v", err)
	}
	for _, addr := range listens {
		for {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	path := filepath.Join(dir, sc.name+".node.cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	driveLabelled(b, listens, sc, p, 1, func(fn func()) {
		pprof.Do(ctx, pprof.Labels("role", "sender"), func(context.Context) { fn() })
	})
	pprof.StopCPUProfile()
	f.Close()
	if err := node.Stop(ctx); err != nil {
		b.Logf("stop the profiled node: %v", err)
	}
	for _, v := range []struct {
		file  string
		flags []string
	}{
		{".node.top.txt", []string{"-tagfocus=role=node"}},
		{".node.cum.txt", []string{"-tagfocus=role=node", "-cum"}},
		{".all.top.txt", nil},
	} {
		args := append([]string{"tool", "pprof", "-top", "-nodecount=40"}, v.flags...)
		out, err := exec.Command("go", append(args, path)...).CombinedOutput()
		if err != nil {
			b.Logf("go tool pprof: %v\n%s", err, out)
			continue
		}
		writeProfileFile(b, sc.name+v.file, string(out))
	}
}

// benchHandler sets a scenario's handler up: it returns the handler name
// the routes use and the config it needs (handlers:, reference_sets:).
type benchHandler func(b testing.TB, db *testcontainers.DB) (name, yaml string)

// jsBenchScript is a realistic transform: a few gets and sets, a filter,
// one reference lookup and one state write per message.
const jsBenchScript = `function transform(msg, ctx) {
  var mrn = msg.get("PID-3.1");
  if (mrn.indexOf("TEST") === 0) return null;
  msg.set("PID-3.1", "GH" + ("00000000" + mrn.replace(/\D/g, "")).slice(-8));
  msg.set("PID-3.4", "GHLAB");
  var label = ctx.lookup("sex", msg.get("PID-8"));
  if (label !== null) msg.set("PID-8", label);
  var ward = msg.get("PV1-3.1");
  msg.set("PV1-3.1", "LAB-" + ward);
  msg.set("MSH-5", "LIS");
  msg.set("MSH-6", "GOODHEALTH");
  ctx.state.set("last-visit", mrn, {at: msg.get("MSH-7"), ward: ward});
  ctx.log.info("sent to the lab");
  return msg;
}`

// jsBenchHandler runs jsBenchScript, with its reference set synced before
// the node starts so no message waits for it.
func jsBenchHandler(b testing.TB, db *testcontainers.DB) (string, string) {
	dir := b.TempDir()
	js := writeScript(b, dir, "bench.js", jsBenchScript)
	csv := writeScript(b, dir, "sex.csv", "code,label\nF,female\nM,male\nU,unknown\n")
	yaml := fmt.Sprintf(`handlers:
  js: {type: javascript, javascript: {file: %q}}
reference_sets:
  sex: {source: {csv: {path: %q}}}
`, js, csv)
	set := &config.ReferenceSet{Name: "sex", Source: config.ReferenceSource{CSV: &config.CSVSource{Path: csv}}}
	if _, err := (&reference.Syncer{Pool: db.Pool, NodeID: "bench"}).Sync(context.Background(), set); err != nil {
		b.Fatalf("sync the bench reference set: %v", err)
	}
	return "js", yaml
}
