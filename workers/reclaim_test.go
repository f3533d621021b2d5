package workers_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/workers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

func inserter(t *testing.T, db *testcontainers.DB) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func exec(t *testing.T, db *testcontainers.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// queue puts one pending outbound row into lane and activates it, as a
// producer does, returning the lane's drainer job.
func queue(t *testing.T, db *testcontainers.DB, ins jobs.Inserter, lane string) int64 {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var msg int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('c', 'test', 1, 'x', 'routed')
			RETURNING id`).Scan(&msg); err != nil {
			return err
		}
		if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO mefor_work (message_id, stage, lane, channel, destination) VALUES ($1, 'outbound', $2, 'c', 'd')`,
			msg, lane); err != nil {
			return err
		}
		return jobs.Activate(ctx, tx, ins, []string{lane})
	})
	if err != nil {
		t.Fatal(err)
	}
	return laneJob(t, db, lane)
}

func laneJob(t *testing.T, db *testcontainers.DB, lane string) int64 {
	t.Helper()
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT job_id FROM mefor_lane WHERE name = $1`, lane).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

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
	ins := inserter(t, db)
	d := &workers.Deps{Pool: db.Pool, Logger: slog.New(slog.DiscardHandler)}

	discarded := queue(t, db, ins, "outbound:discarded")
	exec(t, db, `UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, discarded)
	cancelled := queue(t, db, ins, "outbound:cancelled")
	exec(t, db, `UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE id = $1`, cancelled)
	deleted := queue(t, db, ins, "outbound:deleted")
	exec(t, db, `DELETE FROM river_job WHERE id = $1`, deleted)
	live := queue(t, db, ins, "outbound:live")
	exec(t, db, `UPDATE river_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour' WHERE id = $1`, live)
	idle := queue(t, db, ins, "outbound:idle")
	exec(t, db, `UPDATE mefor_work SET status = 'done' WHERE lane = 'outbound:idle'`)
	exec(t, db, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, idle)

	n, err := workers.Reclaim(context.Background(), d, ins)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("reclaim activated %d lanes, want 3", n)
	}
	for lane, old := range map[string]int64{"outbound:discarded": discarded, "outbound:cancelled": cancelled, "outbound:deleted": deleted} {
		if id := laneJob(t, db, lane); id == old || jobState(t, db, id) != "available" {
			t.Fatalf("lane %s: drainer %d (%s), want a new available one", lane, id, jobState(t, db, id))
		}
	}
	if id := laneJob(t, db, "outbound:live"); id != live || jobState(t, db, id) != "scheduled" {
		t.Fatalf("live lane's drainer replaced or changed: %d %s", id, jobState(t, db, id))
	}
	if id := laneJob(t, db, "outbound:idle"); id != idle || jobState(t, db, id) != "completed" {
		t.Fatalf("idle lane activated: %d %s", id, jobState(t, db, id))
	}
	if n, err := workers.Reclaim(context.Background(), d, ins); err != nil || n != 0 {
		t.Fatalf("second reclaim activated %d lanes (%v), want 0", n, err)
	}
}
