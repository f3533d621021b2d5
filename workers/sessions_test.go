package workers_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
