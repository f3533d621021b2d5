package pipeline_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/testcontainers"
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
	if _, err := f.db.Pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) int(sql string, args ...any) int64 {
	f.t.Helper()
	var n int64
	if err := f.db.Pool.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return n
}
