package search_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// explain is the plan of sql, a line a node, as EXPLAIN with
// opts (none, or e.g. "(ANALYZE, BUFFERS)") shows it through q.
func explain(tb testing.TB, q querier, opts, sql string, args ...any) string {
	tb.Helper()
	rows, err := q.Query(context.Background(), "EXPLAIN "+opts+" "+sql, args...)
	if err != nil {
		tb.Fatalf("explain: %v\n%s", err, sql)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("explain: %v\n%s", err, sql)
	}
	return strings.Join(lines, "\n")
}

// medianMS runs f five times and is the median of its times in
// milliseconds; an error of f fails the benchmark.
func medianMS(b *testing.B, f func() error) float64 {
	b.Helper()
	var times []time.Duration
	for range 5 {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	return float64(times[len(times)/2].Microseconds()) / 1000
}
