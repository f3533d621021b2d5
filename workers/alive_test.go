package workers_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// These tests hold the workers to what a node that may be dead, or that
// the cluster does not agree with, may do: not send, leave rows it does not
// know alone, and have its sessions ended once it is dead.

// A node the cluster may already count as dead (its heartbeat went
// unconfirmed for too long: frozen, cut off) must not send: its lanes may
// be running elsewhere, and a late send would reach the partner after the
// replacement's. The row stays queued for whichever drainer serves the lane.
func TestDrainerDoesNotSendWhileNodeNotAlive(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	cfg := fileRouteConfig(t, "d", dir)
	var alive atomic.Bool
	deps := outboundDeps(t, db, cfg)
	deps.Alive = alive.Load
	client := startOutbound(t, db, deps)

	lane := jobs.OutboundLane("d", 0, 1, 0)
	job := fixtures.Queue(t, db, client, lane)
	fixtures.Eventually(t, 30*time.Second, "the drainer to run and stop", func() bool { return jobState(t, db, job) == "completed" })
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Fatalf("a node not counted as alive delivered %d file(s)", len(files))
	}
	var pending int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE lane = $1 AND status = 'pending'`, lane).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 1 {
		t.Fatalf("%d rows pending, want the 1 row kept for the next drainer", pending)
	}

	// Alive again (or another node): the lane is served.
	alive.Store(true)
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
			return err
		}
		return jobs.Activate(ctx, tx, client, []string{lane})
	})
	if err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the row delivered once the node is alive", func() bool {
		files, _ := os.ReadDir(dir)
		return len(files) == 1
	})
}

// During a reload's convergence a node still on the old config may drain a
// lane of a destination the new config adds, and a node started from
// another file may drain one its file lacks. While the cluster does not
// agree on the node's config, such a row waits, untouched; once it does and
// the node still does not know the destination, it is dead-lettered.
func TestUnknownDestinationWaitsUntilClusterAgrees(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	cfg := fileRouteConfig(t, "other", t.TempDir())
	var agreed atomic.Bool
	deps := outboundDeps(t, db, cfg)
	deps.ConfigAgreed = func(context.Context) bool { return agreed.Load() }
	client := startOutbound(t, db, deps)

	lane := jobs.OutboundLane("d", 0, 1, 0) // queue() writes rows for destination d
	job := fixtures.Queue(t, db, client, lane)
	// A short snooze leaves the job "available" with a later scheduled_at,
	// so watch for the drainer having run instead of for a state.
	fixtures.Eventually(t, 30*time.Second, "the drainer to look at the row", func() bool {
		var ran bool
		if err := db.Pool.QueryRow(ctx, `SELECT attempted_at IS NOT NULL FROM river_job WHERE id = $1`, job).Scan(&ran); err != nil {
			t.Fatal(err)
		}
		return ran
	})
	status := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT status FROM mefor_work WHERE lane = $1`, lane).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	time.Sleep(1500 * time.Millisecond) // at least one more look at the row
	if s := status(); s != "pending" {
		t.Fatalf("row is %s while the cluster does not agree on the node's config, want pending", s)
	}
	agreed.Store(true)
	fixtures.Eventually(t, 30*time.Second, "the row dead-lettered once the cluster agrees", func() bool { return status() == "dead" })
}

// startOutbound runs a River client with only the outbound drainer, on deps.
// fileRouteConfig is a node's config whose one channel, c, routes
// everything (route r) to the file destination dest writing into dir. The
// channel's listener is never bound: these tests queue rows themselves.
func fileRouteConfig(t *testing.T, dest, dir string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("mefor.yaml", []byte(fmt.Sprintf(`
channels:
  c:
    inbound:
      mllp: {listen: "127.0.0.1:1"}
    routes:
      - name: r
        destinations: [%s]
destinations:
  %s:
    type: file
    file: {directory: %q}
`, dest, dest, dir)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startOutbound(t *testing.T, db *testcontainers.DB, deps *workers.Deps) *river.Client[pgx.Tx] {
	t.Helper()
	w := river.NewWorkers()
	river.AddWorker(w, &workers.OutboundWorker{Deps: deps, SendTimeout: time.Second})
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{
		Queues:            map[string]river.QueueConfig{jobs.QueueOutbound: {MaxWorkers: 2}},
		Workers:           w,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	return client
}

// outboundDeps are the workers' dependencies on db for the graph of cfg,
// with the default limits and a silent logger.
func outboundDeps(t *testing.T, db *testcontainers.DB, cfg *config.Config) *workers.Deps {
	t.Helper()
	g := graph(t, cfg)
	return &workers.Deps{
		Pool:    db.Pool,
		Graph:   func() workers.Graph { return g },
		Senders: connector.NewPool(),
		Limits:  workers.DefaultLimits,
		Logger:  slog.New(slog.DiscardHandler),
	}
}

func graph(t *testing.T, cfg *config.Config) workers.Graph {
	t.Helper()
	g, err := engine.NewGraph(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A node cut off half-way through a pipelined batch leaves a session that
// is "active" (waiting for the rest of the pipeline), which no idle timeout
// ends, holding a lane lock the node taking over needs. Once the node is
// past node_timeout, its sessions are ended and the lock comes free; a live
// node's sessions are left alone.
func TestDeadNodeSessionsEndedAndLocksFreed(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	// Each node is judged by the node_timeout it recorded (10s here).
	fixtures.Exec(t, db, `INSERT INTO mefor_node (id, host, pid, last_seen, node_timeout_ms) VALUES
		('dead', 'h', 1, clock_timestamp() - interval '1 minute', 10000), ('live', 'h', 2, clock_timestamp(), 10000)`)

	stuck := func(node string, key int) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = leader.ApplicationName(node)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		// Take a transaction lock inside a pipeline that never gets its
		// Sync: the server runs it and waits for the rest.
		p := conn.PgConn().StartPipeline(ctx)
		p.SendQueryParams(`SELECT pg_advisory_xact_lock($1)`, [][]byte{[]byte(strconv.Itoa(key))}, nil, nil, nil)
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	stuck("dead", 41)
	stuck("live", 42)

	locked := func(key int) bool {
		var got bool
		if err := db.Pool.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got {
			fixtures.Exec(t, db, `SELECT pg_advisory_unlock($1)`, key)
		}
		return !got
	}
	fixtures.Eventually(t, 30*time.Second, "both stuck sessions to hold their locks", func() bool { return locked(41) && locked(42) })
	var state string
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE application_name = $1`, leader.ApplicationName("dead")).Scan(&state); err != nil {
		t.Fatal(err)
	}
	t.Logf("the stuck session is %q", state)

	ended, err := leader.TerminateDeadNodeSessions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ended) != 1 || ended[0] != "dead" {
		t.Fatalf("ended sessions of %v, want only the dead node's", ended)
	}
	fixtures.Eventually(t, 30*time.Second, "the dead node's lock to come free", func() bool { return !locked(41) })
	if !locked(42) {
		t.Fatal("a live node's session was ended")
	}
}
