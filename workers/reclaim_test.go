package workers_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

func jobState(t *testing.T, db *testcontainers.DB, id int64) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "deleted"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Reclaim gives a new drainer to every lane with backlog whose drainer is
// gone (discarded, cancelled, deleted) and leaves alone lanes whose drainer
// is live and lanes with nothing pending.
func TestReclaimActivatesOnlyStrandedLanes(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
	d := &workers.Deps{Pool: db.Pool, Logger: slog.New(slog.DiscardHandler)}

	discarded := fixtures.Queue(t, db, ins, "outbound:discarded")
	fixtures.Exec(t, db, `UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, discarded)
	cancelled := fixtures.Queue(t, db, ins, "outbound:cancelled")
	fixtures.Exec(t, db, `UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE id = $1`, cancelled)
	deleted := fixtures.Queue(t, db, ins, "outbound:deleted")
	fixtures.Exec(t, db, `DELETE FROM river_job WHERE id = $1`, deleted)
	live := fixtures.Queue(t, db, ins, "outbound:live")
	fixtures.Exec(t, db, `UPDATE river_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour' WHERE id = $1`, live)
	idle := fixtures.Queue(t, db, ins, "outbound:idle")
	fixtures.Exec(t, db, `UPDATE mefor_work SET status = 'done' WHERE lane = 'outbound:idle'`)
	fixtures.Exec(t, db, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, idle)

	n, err := workers.Reclaim(context.Background(), d, ins)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("reclaim activated %d lanes, want 3", n)
	}
	for lane, old := range map[string]int64{"outbound:discarded": discarded, "outbound:cancelled": cancelled, "outbound:deleted": deleted} {
		if id := fixtures.LaneJob(t, db, lane); id == old || jobState(t, db, id) != "available" {
			t.Fatalf("lane %s: drainer %d (%s), want a new available one", lane, id, jobState(t, db, id))
		}
	}
	if id := fixtures.LaneJob(t, db, "outbound:live"); id != live || jobState(t, db, id) != "scheduled" {
		t.Fatalf("live lane's drainer replaced or changed: %d %s", id, jobState(t, db, id))
	}
	if id := fixtures.LaneJob(t, db, "outbound:idle"); id != idle || jobState(t, db, id) != "completed" {
		t.Fatalf("idle lane activated: %d %s", id, jobState(t, db, id))
	}
	if n, err := workers.Reclaim(context.Background(), d, ins); err != nil || n != 0 {
		t.Fatalf("second reclaim activated %d lanes (%v), want 0", n, err)
	}
}
