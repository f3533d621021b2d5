package pipeline_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// fixture is a test's own database and the helpers that query it.
type fixture struct {
	t   *testing.T
	ctx context.Context
	db  *testcontainers.DB
}

func newFixture(t *testing.T) *fixture {
	t.Parallel()
	return &fixture{t: t, ctx: context.Background(), db: testcontainers.NewDB(t)}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	fixtures.Exec(f.t, f.db, sql, args...)
}

func (f *fixture) int(sql string, args ...any) int64 {
	f.t.Helper()
	return fixtures.Count(f.t, f.db.Pool, sql, args...)
}
