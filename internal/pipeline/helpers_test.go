package pipeline_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

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
