package pipeline_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// inserter is an insert-only River client, as the CLI uses.
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
	var id int64
	if err := db.Pool.QueryRow(ctx, `SELECT job_id FROM mefor_lane WHERE name = $1`, lane).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// start marks job id running, as River's fetch does, and returns that
// execution.
func start(t *testing.T, db *testcontainers.DB, id int64) pipeline.Execution {
	t.Helper()
	ex := pipeline.Execution{JobID: id}
	if err := db.Pool.QueryRow(context.Background(), `
		UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1
		RETURNING attempted_at`, id).Scan(&ex.AttemptedAt); err != nil {
		t.Fatal(err)
	}
	return ex
}
