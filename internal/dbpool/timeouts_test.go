package dbpool_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// show reads a setting of a session of pool.
func show(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	var v string
	if err := pool.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A command's sessions and a node's run under their own timeouts, those a
// URL sets are kept, and a transaction of a tighter kind (intake) gets its
// own for itself only.
func TestSessionsRunUnderTheirKindsTimeouts(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	open := func(cfg *pgxpool.Config) *pgxpool.Pool {
		pool, err := dbpool.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	cmdCfg, err := dbpool.CommandConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cmd := open(cmdCfg)
	for name, want := range map[string]string{"statement_timeout": "0", "lock_timeout": "10s",
		"idle_in_transaction_session_timeout": "1min"} {
		if got := show(t, cmd, name); got != want {
			t.Errorf("command session %s = %s, want %s", name, got, want)
		}
	}
	node := open(dbpool.NodeConfig(cmdCfg, dbpool.NodeOptions{ApplicationName: "mefor t", LeaseTTL: 15 * time.Second}))
	for name, want := range map[string]string{"statement_timeout": "1min", "lock_timeout": "30s",
		"idle_in_transaction_session_timeout": "15s"} {
		if got := show(t, node, name); got != want {
			t.Errorf("node session %s = %s, want %s", name, got, want)
		}
	}
	urlCfg, err := dbpool.CommandConfig(db.URL + "&lock_timeout=2500&statement_timeout=7000")
	if err != nil {
		t.Fatal(err)
	}
	nodeURL := open(dbpool.NodeConfig(urlCfg, dbpool.NodeOptions{LeaseTTL: 15 * time.Second}))
	if l, s := show(t, nodeURL, "lock_timeout"), show(t, nodeURL, "statement_timeout"); l != "2500ms" || s != "7s" {
		t.Errorf("node session with the URL's timeouts: lock %s statement %s, want 2500ms and 7s", l, s)
	}
	err = pgx.BeginFunc(ctx, node, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, dbpool.Intake.SetLocal()); err != nil {
			return err
		}
		var l, s string
		if err := tx.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&l, &s); err != nil {
			return err
		}
		if l != "5s" || s != "10s" {
			t.Errorf("intake transaction: lock %s statement %s, want 5s and 10s", l, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := show(t, node, "lock_timeout"); got != "30s" {
		t.Errorf("after an intake transaction the session's lock_timeout is %s, want 30s", got)
	}
}

// A command waiting for a lock another session holds is refused within
// its lock timeout instead of waiting with no end.
func TestCommandLockWaitIsBounded(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := dbpool.CommandConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := dbpool.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cmd.Close)
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, "LOCK TABLE mefor_message IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = cmd.Exec(ctx, "UPDATE mefor_message SET status = status WHERE false")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("a command's statement behind a held lock: %v after %s; want lock_not_available", err, time.Since(start))
	}
	if took := time.Since(start); took < dbpool.CommandSession.Lock-time.Second || took > dbpool.CommandSession.Lock+5*time.Second {
		t.Errorf("refused after %s, want about %s", took, dbpool.CommandSession.Lock)
	}
}
