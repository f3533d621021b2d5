package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers"
)

// benchDBLine reads the durability settings back from the server: SHOW for
// the settings, and the data directory's mount in the server's own
// /proc/self/mounts (tmpfs makes an fsync free, so it is no durable figure).
func benchDBLine(b *testing.B, db *testcontainers.DB) string {
	b.Helper()
	ctx := context.Background()
	show := func(name string) string {
		var v string
		if err := db.Pool.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			b.Fatalf("SHOW %s: %v", name, err)
		}
		return v
	}
	dataDir := show("data_directory")
	var mounts string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_read_file('/proc/self/mounts')`).Scan(&mounts); err != nil {
		b.Fatalf("read the server's mounts: %v", err)
	}
	// The data directory is on the longest mount point that prefixes it.
	best, fstype := "", "unknown"
	for _, line := range strings.Split(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (dataDir == mp || strings.HasPrefix(dataDir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, fstype = mp, f[2]
		}
	}
	data := "disk"
	switch {
	case fstype == "tmpfs" || fstype == "ramfs":
		data = "tmpfs"
	case fstype == "overlay" || strings.HasPrefix(fstype, "fuse"):
		data = fstype // the container's own layer, not a volume
	}
	return fmt.Sprintf("BENCH db fsync=%s synchronous_commit=%s data=%s full_page_writes=%s fs=%s autovacuum_naptime=%s wal_ready_mb=%d",
		show("fsync"), show("synchronous_commit"), data, show("full_page_writes"), fstype, show("autovacuum_naptime"),
		walReadyMB(ctx, b, db))
}

// prewarmWAL gives the bench server the WAL files of one that has been
// running under load. A fresh server has a single WAL segment, so under
// load it creates each next one: it zero-fills and fsyncs 16 MB while
// holding the WAL write lock, and every commit waits behind that, once
// every 16 MB of WAL. A server that has run for a while never does: each
// checkpoint renames the segments it no longer needs into future ones (up
// to about twice the WAL between checkpoints, capped by max_wal_size).
// 512 MB of WAL records that change no table, then a checkpoint, leave
// that state; the settings stay PostgreSQL's defaults.
// MEFOR_BENCH_WAL_PREWARM=0 skips it, to measure a server in its first
// minutes. A server without fsync (MEFOR_PG_DURABLE=0) is left as it is:
// creating a file there costs no flush.
func prewarmWAL(ctx context.Context, b *testing.B, db *testcontainers.DB) {
	b.Helper()
	if os.Getenv("MEFOR_BENCH_WAL_PREWARM") == "0" {
		return
	}
	var fsync string
	if err := db.Pool.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		b.Fatalf("SHOW fsync: %v", err)
	}
	if fsync != "on" {
		return
	}
	const chunkMB, chunks = 1, 512
	if _, err := db.Pool.Exec(ctx, `SELECT count(pg_logical_emit_message(false, 'mefor-bench-prewarm', repeat('x', $1)))
		FROM generate_series(1, $2)`, chunkMB<<20, chunks); err != nil {
		b.Fatalf("pre-warm the WAL (needs a superuser; MEFOR_BENCH_WAL_PREWARM=0 skips it): %v", err)
	}
	if _, err := db.Pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatalf("checkpoint after the WAL pre-warm: %v", err)
	}
}

// walReadyMB is the size of the WAL segment files ahead of the one being
// written: what the server can fill before it must create a file.
func walReadyMB(ctx context.Context, b *testing.B, db *testcontainers.DB) int64 {
	b.Helper()
	var bytes int64
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(sum(size), 0) FROM pg_ls_waldir()
		WHERE name ~ '^[0-9A-F]{24}$' AND name > pg_walfile_name(pg_current_wal_lsn())`).Scan(&bytes); err != nil {
		b.Fatalf("read the WAL directory: %v", err)
	}
	return bytes >> 20
}

// statements is pg_stat_statements when the server preloads it
// (MEFOR_PG_STATEMENTS=1, set by task bench), else nil.
type statements struct {
	db *testcontainers.DB
}

func newStatements(b *testing.B, db *testcontainers.DB) *statements {
	b.Helper()
	ctx := context.Background()
	var preload string
	if err := db.Pool.QueryRow(ctx, "SHOW shared_preload_libraries").Scan(&preload); err != nil {
		b.Fatal(err)
	}
	if !strings.Contains(preload, "pg_stat_statements") {
		return nil
	}
	if _, err := db.Pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		b.Fatalf("create pg_stat_statements: %v", err)
	}
	return &statements{db: db}
}

// reset clears the server's statement and WAL statistics.
func (s *statements) reset(b *testing.B) {
	if s == nil {
		return
	}
	if _, err := s.db.Pool.Exec(context.Background(), "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal')"); err != nil {
		b.Fatalf("reset pg_stat_statements: %v", err)
	}
}

// walStats is what the server wrote to its WAL since the last reset.
type walStats struct {
	syncs     int64         // flushes to disk: a durable commit waits for one
	syncMean  time.Duration // their mean time
	bytes     int64         // WAL written, full-page images included
	fullPages int64         // full-page images among it
}

// wal is the server's WAL statistics since the last reset. A flush that
// covers several commits is group commit at work; the bytes are the work
// every row and index entry a message writes costs the server, and unlike
// a time they repeat from run to run on a noisy machine.
func (s *statements) wal(b *testing.B) walStats {
	b.Helper()
	if s == nil {
		return walStats{}
	}
	var w walStats
	var ms float64
	if err := s.db.Pool.QueryRow(context.Background(),
		`SELECT wal_sync, wal_sync_time, wal_bytes::bigint, wal_fpi FROM pg_stat_wal`).Scan(&w.syncs, &ms, &w.bytes, &w.fullPages); err != nil {
		b.Fatalf("read pg_stat_wal: %v", err)
	}
	if w.syncs > 0 {
		w.syncMean = time.Duration(ms / float64(w.syncs) * float64(time.Millisecond))
	}
	return w
}

// blocks is the shared buffers the bench database's statements touched
// since the last reset (hit, read or dirtied): with the WAL bytes, the
// server's work per message, counted rather than timed.
func (s *statements) blocks(b *testing.B) int64 {
	b.Helper()
	if s == nil {
		return 0
	}
	var n int64
	if err := s.db.Pool.QueryRow(context.Background(), `
		SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'`).Scan(&n); err != nil {
		b.Fatalf("read pg_stat_statements: %v", err)
	}
	return n
}

type stmtStat struct {
	query             string
	calls             int64
	totalMS, meanMS   float64
	rows              int64
	sharedHit, shRead int64
	plans             int64
	planMS            float64
}

// top is the bench database's n statements with the most total execution
// time since the last reset.
func (s *statements) top(b *testing.B, n int) []stmtStat {
	b.Helper()
	if s == nil {
		return nil
	}
	rows, err := s.db.Pool.Query(context.Background(), `
		SELECT regexp_replace(query, '\s+', ' ', 'g'), calls, total_exec_time, mean_exec_time, rows,
			shared_blks_hit, shared_blks_read, plans, total_plan_time
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'
		ORDER BY total_exec_time + total_plan_time DESC LIMIT $1`, n)
	if err != nil {
		b.Fatalf("read pg_stat_statements: %v", err)
	}
	defer rows.Close()
	var out []stmtStat
	for rows.Next() {
		var st stmtStat
		if err := rows.Scan(&st.query, &st.calls, &st.totalMS, &st.meanMS, &st.rows, &st.sharedHit, &st.shRead, &st.plans, &st.planMS); err != nil {
			b.Fatal(err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return out
}

// format renders statement statistics as a table, queries cut to width.
func formatStatements(title string, sts []stmtStat, width int) string {
	var w strings.Builder
	fmt.Fprintf(&w, "%s\n%10s %12s %10s %10s %10s %8s %10s  query\n", title, "calls", "total_ms", "mean_ms", "rows", "blks/call", "plans", "plan_ms")
	for _, st := range sts {
		q := st.query
		if len(q) > width {
			q = q[:width] + "…"
		}
		// Buffers touched per call: a statement whose count grows with the
		// tables is scanning them.
		blks := float64(st.sharedHit+st.shRead) / float64(max(st.calls, 1))
		// plans close to calls: the server plans the statement at every
		// execution (a custom plan), and plan_ms is what that costs.
		fmt.Fprintf(&w, "%10d %12.1f %10.3f %10d %10.1f %8d %10.1f  %s\n", st.calls, st.totalMS, st.meanMS, st.rows, blks, st.plans, st.planMS, q)
	}
	return w.String()
}

// profileDir is MEFOR_BENCH_PROFILE: where the benchmark writes each
// scenario's pg_stat_statements top 15 and the node's CPU profile.
func profileDir() string { return os.Getenv("MEFOR_BENCH_PROFILE") }

// writeProfileFile writes name into the profile directory, if one is set.
func writeProfileFile(b *testing.B, name, content string) {
	b.Helper()
	dir := profileDir()
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		b.Fatal(err)
	}
}

// serverCPU is the CPU time PostgreSQL's processes have used since its
// container started (every backend, autovacuum and the WAL writer, those
// that exited included), read from the container's cgroup on this host.
// ok is false where the engine is remote or the cgroup is not readable.
//
// CPU per message is the server's cost of the work, far steadier on a
// shared machine than throughput: a neighbour's load slows a scenario but
// leaves what each message cost roughly as it was.
func serverCPU(b *testing.B, db *testcontainers.DB) (time.Duration, bool) {
	b.Helper()
	info, err := db.Server.Container().Inspect(context.Background())
	if err != nil || info.State == nil || info.State.Pid == 0 {
		return 0, false
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", info.State.Pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "": // cgroup v2: usage_usec in cpu.stat
			raw, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", f[2], "cpu.stat"))
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(raw), "\n") {
				var us int64
				if _, err := fmt.Sscanf(l, "usage_usec %d", &us); err == nil {
					return time.Duration(us) * time.Microsecond, true
				}
			}
		case strings.Contains(","+f[1]+",", ",cpuacct,"): // cgroup v1: nanoseconds
			for _, dir := range []string{"cpuacct", f[1]} {
				raw, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", dir, f[2], "cpuacct.usage"))
				if err != nil {
					continue
				}
				var ns int64
				if _, err := fmt.Sscanf(strings.TrimSpace(string(raw)), "%d", &ns); err == nil {
					return time.Duration(ns), true
				}
			}
		}
	}
	return 0, false
}
