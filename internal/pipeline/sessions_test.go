package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
)

// Readying a new session (pipeline.WarmSession) runs every warm statement on
// the migrated schema without an error, changes no row and no count, and
// leaves the session outside a transaction. A warm statement a schema
// change broke would otherwise go unnoticed: the node ignores its error.
// A table locked by someone else (a migration) costs the warm-up a bounded
// wait and an error, never the session.
func TestWarmSessionChangesNothing(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_message (channel, source, size, status) VALUES ('adt', 'test', 10, 'received');
		INSERT INTO mefor_work (message_id, stage, lane, channel, status)
			SELECT id, 'ingress', 'ingress:adt', channel, 'pending' FROM mefor_message`); err != nil {
		t.Fatal(err)
	}
	snapshot := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT
			(SELECT string_agg(id || status, ',' ORDER BY id) FROM mefor_message) || ' ' ||
			(SELECT string_agg(id || status, ',' ORDER BY id) FROM mefor_work) || ' ' ||
			(SELECT count(*) FROM mefor_message_count) || ' ' || (SELECT count(*) FROM mefor_work_count)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := pipeline.WarmSession(ctx, conn); err != nil {
		t.Fatalf("warm a session of a migrated database: %v", err)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after warming, the session's transaction status is %q, want idle", st)
	}
	if after := snapshot(); after != before {
		t.Fatalf("warming a session changed the tables: before %s, after %s", before, after)
	}
	if err := pipeline.VerifyCounts(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}

	// A migration holds mefor_work.
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE mefor_work IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = pipeline.WarmSession(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "lock") {
		t.Fatalf("warming while mefor_work is locked: %v, want a lock timeout", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("warming waited %v for a locked table", waited)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after a failed warm-up, the session's transaction status is %q, want idle", st)
	}
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("the session after a failed warm-up: %v", err)
	}
}
