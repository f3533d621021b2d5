package search_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/freeport"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// These hold the status reads to what a large store needs: plans that read
// no whole table, and a benchmark of status on a million queued deliveries.

// What `mefor status`, the gauges and `messages list --status error` run
// never reads the messages or rows tables whole, however many are kept or
// queued: the counts come from the summary tables, the oldest pending row
// of each group is the first entry of its range of mefor_work_pending_age,
// and the error listing walks mefor_message_status_id newest first and
// stops at the limit. Sequential scans are disabled so the plans show what
// the indexes allow rather than what the planner prefers on a tiny table.
func TestStatusPlansReadNoWholeTable(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO mefor_message (channel, source, size, status)
			SELECT 'adt', 'test', 10, CASE WHEN i % 10 = 0 THEN 'error' ELSE 'routed' END FROM generate_series(1, 2000) i`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status)
			SELECT id, 'outbound', 'outbound:lab', channel, 'lab', CASE WHEN status = 'error' THEN 'dead' ELSE 'pending' END
			FROM mefor_message`,
		`ANALYZE mefor_message`, `ANALYZE mefor_work`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(sql string, args ...any) string {
		t.Helper()
		var p string
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
				return err
			}
			p = explain(t, tx, "", sql, args...)
			return nil
		})
		if err != nil {
			t.Fatalf("explain: %v\n%s", err, sql)
		}
		return p
	}
	bigTable := regexp.MustCompile(`(Scan|Scan Backward) (using \S+ )?on mefor_(message|work)( |$)`)
	for _, sql := range search.StatusSQL() {
		p := plan(sql)
		for _, m := range bigTable.FindAllString(p, -1) {
			// The pending groups' lookups are one index probe per group.
			if strings.Contains(m, "using mefor_work_pending_age ") {
				continue
			}
			t.Errorf("status reads a whole table (%s):\n%s\n%s", m, sql, p)
		}
	}
	if p := plan(search.BacklogSQL()); !strings.Contains(p, "mefor_work_pending_age") {
		t.Errorf("the oldest pending row is not read from mefor_work_pending_age:\n%s", p)
	}
	sql, args := search.ListMessagesSQL(search.MessageFilter{Status: pipeline.StatusError})
	p := plan(sql, args)
	if !strings.Contains(p, "Index Scan Backward using mefor_message_status_id") || strings.Contains(p, "Sort") ||
		!strings.HasPrefix(p, "Limit") {
		t.Errorf("list --status error does not walk its index newest first up to the limit:\n%s", p)
	}
}

// BenchmarkStatusBacklog1M measures what an operator waits for while a
// partner is down and a million deliveries queue for it: `mefor status`
// and `mefor messages list --status error`, both as SQL time (the ops
// call) and as wall time of the built `mefor` binary. It prints one line:
//
//	BENCH status-backlog-1m queued=… status_ms=… status_cli_ms=… list_error_ms=… list_error_cli_ms=…
//
// MEFOR_BENCH_BACKLOG overrides the million. Run it on its own:
//
//	go test -run '^$' -bench StatusBacklog1M -benchtime 1x -timeout 30m ./internal/search/
func BenchmarkStatusBacklog1M(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("MEFOR_BENCH_BACKLOG")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	bin := filepath.Join(b.TempDir(), "mefor")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/mefor/mefor/cmd/mefor").CombinedOutput(); err != nil {
		b.Fatalf("build mefor: %v\n%s", err, out)
	}
	for range b.N {
		db := fixtures.BenchDB(b, func(db *testcontainers.DB) string {
			loadBacklog(b, db, n)
			return fmt.Sprintf("loaded a backlog of %d deliveries", n)
		})

		cli := func(args ...string) func() error {
			return func() error {
				cmd := exec.Command(bin, args...)
				cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("mefor %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return nil
			}
		}
		b.StartTimer()
		var queued int64
		statusMS := medianMS(b, func() error {
			st, err := ops.Status(ctx, db.Pool)
			if err == nil && len(st.Destinations) > 0 {
				queued = st.Destinations[0].Queued
			}
			return err
		})
		listMS := medianMS(b, func() error {
			got, err := search.ListMessages(ctx, db.Pool, search.MessageFilter{Status: pipeline.StatusError})
			if err == nil && len(got) != search.DefaultListLimit {
				err = fmt.Errorf("list --status error found %d, want %d", len(got), search.DefaultListLimit)
			}
			return err
		})
		statusCLI := medianMS(b, cli("status"))
		listCLI := medianMS(b, cli("messages", "list", "--status", "error"))
		b.StopTimer()
		var want int64
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE status = 'pending'`).Scan(&want); err != nil {
			b.Fatal(err)
		}
		if queued != want || want < int64(n)*99/100 {
			b.Errorf("status shows %d queued for the partner; %d are pending, about %d loaded", queued, want, n)
		}
		fmt.Printf("BENCH status-backlog-1m queued=%d status_ms=%.2f status_cli_ms=%.2f list_error_ms=%.2f list_error_cli_ms=%.2f\n",
			queued, statusMS, statusCLI, listMS, listCLI)
		for _, q := range search.StatusSQL() {
			b.Logf("%s\n%s", strings.TrimSpace(q), explain(b, db.Pool, "(ANALYZE, BUFFERS)", q))
		}
		sql, args := search.ListMessagesSQL(search.MessageFilter{Status: pipeline.StatusError})
		b.Logf("%s\n%s", strings.TrimSpace(sql), explain(b, db.Pool, "(ANALYZE, BUFFERS)", sql, args))

		heapBase, heapPeak, attempts := runNodeOnBacklog(b, db, 20*time.Second)
		fmt.Printf("BENCH status-backlog-1m-node heap_base_mb=%.1f heap_peak_mb=%.1f head_attempts=%d\n",
			heapBase, heapPeak, attempts)
		if heapPeak-heapBase > 100 {
			b.Errorf("the node's heap grew by %.0f MB over a backlog of %d: it loads the backlog", heapPeak-heapBase, n)
		}
	}
}

// runNodeOnBacklog runs a real node on the backlog for d, its partner
// down, with reclaim every second and alert rules (queue depth, dead
// letters, age) evaluated every second, and returns the Go heap in use
// before it started and the most seen while it ran, and how many attempts
// the lane's head got (so the drainer did run).
func runNodeOnBacklog(b *testing.B, db *testcontainers.DB, d time.Duration) (base, peak float64, attempts int64) {
	b.Helper()
	ctx := context.Background()
	listen := freeport.Addr(b, "127.0.0.1")
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	partner := down.Addr().String()
	down.Close() // nothing listens there: the partner is down
	y := fmt.Sprintf(`
channels:
  adt:
    inbound:
      mllp: {listen: "%s"}
    routes:
      - name: all
        destinations: [partner]
destinations:
  partner:
    type: mllp
    mllp: {address: "%s"}
    retry: {max_attempts: 0, backoff: 200ms, max_backoff: 1s}
alerts:
  interval: 1s
  sinks:
    journal:
      log: {level: info}
  rules:
    - name: partner-backlog
      destination: partner
      queue_depth: 1
      dead_letters: 1
      oldest_queued: 1m
      sinks: [journal]
`, listen, partner)
	cfg, err := config.Parse("bench.yaml", []byte(y), nil)
	if err != nil {
		b.Fatalf("config: %v\n%s", err, y)
	}
	heap := func() float64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapInuse) / (1 << 20)
	}
	base = heap()
	node, err := engine.New(engine.Options{Config: cfg, Pool: db.Pool, NodeID: "bench", ReclaimInterval: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := node.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, float64(m.HeapInuse)/(1<<20))
	}
	if err := node.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	err = db.Pool.QueryRow(ctx, `
		SELECT attempts FROM mefor_work WHERE lane = 'outbound:partner' AND status = 'pending' ORDER BY seq LIMIT 1`).Scan(&attempts)
	if err != nil {
		b.Fatal(err)
	}
	return base, peak, attempts
}

// loadBacklog writes, by SQL and in the shape the engine leaves them, 200k
// processed messages of history (ingress, routed and outbound rows done),
// then n messages routed to partner whose deliveries are all still pending
// in its one lane, and among them (one in 1,001) n/1,000 error messages
// whose delivery is dead.
func loadBacklog(b *testing.B, db *testcontainers.DB, n int) {
	b.Helper()
	ctx := context.Background()
	history := 200_000
	stmts := []string{
		`INSERT INTO mefor_message (channel, received_at, updated_at, source, control_id, message_type, trigger_event,
			size, raw, status, patient_key)
		SELECT 'adt', clock_timestamp() - interval '1 day', clock_timestamp(), 'bench', 'C' || i, 'ADT', 'A01', 120,
			convert_to('MSH|^~\&|REG|HOSP|EHR|HOSP|20260101120000||ADT^A01|C' || i || '|P|2.5' || chr(13), 'UTF8'),
			CASE WHEN i <= $2 THEN 'processed' WHEN (i - $2) % 1001 = 0 THEN 'error' ELSE 'routed' END, 'P' || (i % 200000)
		FROM generate_series(1, $1::int + $2::int + ($1::int / 1000)) AS i`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, status, attempts,
			created_at, finished_at)
		SELECT m.id, s.stage, s.stage || ':' || CASE WHEN s.stage = 'outbound' THEN 'partner' ELSE 'adt' END,
			'adt', CASE WHEN s.stage <> 'ingress' THEN 'all' END, CASE WHEN s.stage <> 'ingress' THEN 'passthrough' END,
			CASE WHEN s.stage = 'outbound' THEN 'partner' END,
			CASE WHEN s.stage <> 'outbound' OR m.status = 'processed' THEN 'done'
				WHEN m.status = 'error' THEN 'dead' ELSE 'pending' END,
			CASE WHEN s.stage = 'outbound' AND m.status = 'routed' THEN 3 ELSE 1 END,
			m.received_at, CASE WHEN s.stage <> 'outbound' OR m.status <> 'routed' THEN m.received_at END
		FROM mefor_message m CROSS JOIN (VALUES ('ingress', 1), ('routed', 2), ('outbound', 3)) AS s (stage, o)
		ORDER BY m.id, s.o`,
		`INSERT INTO mefor_lane (name, stage) VALUES ('ingress:adt', 'ingress'), ('routed:adt', 'routed'),
			('outbound:partner', 'outbound')`,
		`VACUUM (ANALYZE, PARALLEL 0) mefor_message`,
		`VACUUM (ANALYZE, PARALLEL 0) mefor_work`,
	}
	for _, s := range stmts {
		var err error
		if strings.Contains(s, "$1") {
			_, err = db.Pool.Exec(ctx, s, n, history)
		} else {
			_, err = db.Pool.Exec(ctx, s)
		}
		if err != nil {
			b.Fatalf("load backlog: %v\n%s", err, s)
		}
	}
}
