package pipeline_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// laneTest marks t parallel and gives it a database of its own with an
// insert-only River client on it, for a test that queues lanes' rows and
// drainers.
func laneTest(t *testing.T) (context.Context, *testcontainers.DB, jobs.Inserter) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	return context.Background(), db, fixtures.Inserter(t, db)
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

// message inserts a bare message on channel with status, as a test's
// starting state: the rows that go with it are the test's to write.
func message(t *testing.T, db *testcontainers.DB, channel, status string) int64 {
	t.Helper()
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ($1, 'test', 1, 'x', $2)
		RETURNING id`, channel, status).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// received inserts a bare message received on channel with its pending
// ingress row.
func received(t *testing.T, db *testcontainers.DB, channel string) int64 {
	t.Helper()
	id := message(t, db, channel, "received")
	fixtures.Exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel) VALUES ($1, 'ingress', 'ingress:' || $2, $2)`, id, channel)
	return id
}
