package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The pipeline's statements are planned once per session, not at every
// execution: PostgreSQL would otherwise plan each anew (a custom plan),
// which cost the server more than running them (pipeline.PipelineTx). Over
// one session, intake (first in a transaction that activates the lane,
// then in the one round trip), lane reads, route hand-offs and the empty
// check must show no custom plan at all (with the settings removed the
// first five executions of each are custom), and their plans, made while
// the tables were empty, must not scan them.
func TestPipelineStatementsPlanOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	conn := c.Conn()

	seqScans := func() int {
		return count(t, db, `SELECT coalesce(sum(seq_scan), 0)::int FROM pg_stat_user_tables WHERE relname IN ('mefor_work', 'mefor_message')`)
	}
	scansBefore := 0

	const runs = 8
	for i := range runs {
		if i == 1 {
			// As autovacuum does on a new install once the first rows
			// are in: statistics of near-empty tables, which the plans
			// made from now on (the ANALYZE invalidates those made so
			// far) are based on.
			fixtures.Exec(t, db, `ANALYZE mefor_work, mefor_message`)
			scansBefore = seqScans()
		}
		ctrl := fmt.Sprintf("C%d", i)
		_, err := pipeline.ReceiveBatch(ctx, conn, ins, []pipeline.Inbound{{Channel: "adt", Source: "test",
			Raw: []byte(strings.Replace(handoffBody, "|C1|", "|"+ctrl+"|", 1)), ControlID: ctrl, MessageType: "ADT", TriggerEvent: "A01"}})
		if err != nil {
			t.Fatalf("store message %d: %v", i, err)
		}
		rows, err := pipeline.PendingRows(ctx, conn, jobs.IngressLane("adt"), 10)
		if err != nil || len(rows) != 1 || rows[0].ControlID != ctrl {
			t.Fatalf("read ingress lane after message %d: %+v, %v", i, rows, err)
		}
		err = pgx.BeginTxFunc(ctx, conn, pipeline.PipelineTx, func(tx pgx.Tx) error {
			return pipeline.RouteHandoff(ctx, tx, ins, rows[0], []pipeline.RoutedOut{{Route: "r", Handler: "passthrough"}})
		})
		if err != nil {
			t.Fatalf("route message %d: %v", i, err)
		}
		var empty bool
		err = pgx.BeginTxFunc(ctx, conn, pipeline.PipelineTx, func(tx pgx.Tx) error {
			empty, err = pipeline.CompleteIfEmpty(ctx, tx, jobs.IngressLane("adt"))
			return err
		})
		if err != nil || !empty {
			t.Fatalf("ingress lane after routing message %d: empty %v, %v", i, empty, err)
		}
		// A delivery lane's read is a statement of its own (it reads the
		// layout barrier too).
		if rows, err := pipeline.PendingRows(ctx, conn, jobs.OutboundLane("d", 0, 0, 0), 10); err != nil || len(rows) != 0 {
			t.Fatalf("read outbound lane after message %d: %+v, %v", i, rows, err)
		}
	}
	// The session's table counts reach the statistics once it is idle
	// after this call; the counts below are read by other sessions.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	// These tables were nearly empty when the plans were made: a plan that
	// scans them would keep scanning as they grow, until the next ANALYZE.
	if n := seqScans() - scansBefore; n != 0 {
		t.Errorf("%d sequential scans of mefor_work and mefor_message in the session, want none", n)
	}
	if n := count(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'routed' AND status = 'pending'`); n != runs {
		t.Fatalf("%d routed rows pending, want %d", n, runs)
	}

	rows, err := conn.Query(ctx, `
		SELECT regexp_replace(statement, '\s+', ' ', 'g'), generic_plans, custom_plans
		FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'`)
	if err != nil {
		t.Fatal(err)
	}
	type plans struct {
		SQL             string
		Generic, Custom int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[plans])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"INSERT INTO mefor_message": false, "JOIN mefor_message m ON m.id = w.message_id": false,
		"CROSS JOIN LATERAL":                           false,
		"UPDATE mefor_message m SET status = u.status": false, "ORDER BY seq LIMIT 1": false}
	for _, p := range got {
		if p.Custom > 0 {
			t.Errorf("planned for its values (%d custom plans, %d generic): %.150s", p.Custom, p.Generic, p.SQL)
		}
		for key := range want {
			if strings.Contains(p.SQL, key) && p.Generic > 0 {
				want[key] = true
			}
		}
	}
	for key, seen := range want {
		if !seen {
			t.Errorf("no statement with %q ran with a generic plan in this session", key)
		}
	}

	// The lane reads' plans, as the session keeps them, run as a drainer
	// runs them: they must not be compiled. A generic plan's estimates (a
	// long lane, a scan made dear) can pass jit_above_cost, and compiling
	// costs far more than this read.
	for _, read := range []struct{ lane, like, notLike string }{
		{jobs.IngressLane("adt"), "%JOIN mefor_message m ON m.id = w.message_id%", "%mefor_lane%"},
		{jobs.OutboundLane("d", 0, 0, 0), "%JOIN mefor_message m ON m.id = w.message_id%mefor_lane%", "%pg_prepared_statements%"},
	} {
		var name string
		if err := conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements
			WHERE statement LIKE $1 AND statement NOT LIKE $2
			  AND statement NOT LIKE '%pg_prepared_statements%'`, read.like, read.notLike).Scan(&name); err != nil {
			t.Fatalf("the read of %s: its prepared statement: %v", read.lane, err)
		}
		err = pgx.BeginTxFunc(ctx, conn, pipeline.PipelineTx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE) EXECUTE %q (%s, 10, 0)`, name, quote(read.lane)))
			if err != nil {
				return err
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			plan := strings.Join(lines, "\n")
			if strings.Contains(plan, "JIT") {
				t.Errorf("the read of %s was compiled:\n%s", read.lane, plan)
			}
			if barrier := strings.Contains(plan, "mefor_lane"); barrier != (read.lane != jobs.IngressLane("adt")) {
				t.Errorf("the read of %s reads the layout barrier: %v, want only for a delivery lane:\n%s", read.lane, barrier, plan)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// quote is s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
