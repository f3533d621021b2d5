package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// These tests hold the pipeline's statements to plans made once per
// session and by index: generic plans, writes by id that statistics cannot
// mislead, and the warm-up of a new session.

// The pipeline's statements are planned once per session, not at every
// execution: PostgreSQL would otherwise plan each anew (a custom plan),
// which cost the server more than running them (pipeline.PipelineTx). Over
// one session, intake (first in a transaction that activates the lane,
// then in the one round trip), lane reads, route hand-offs and the empty
// check must show no custom plan at all (with the settings removed the
// first five executions of each are custom), and their plans, made while
// the tables were empty, must not scan them.
func TestPipelineStatementsPlanOnce(t *testing.T) {
	ctx, db, ins := laneTest(t)
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

// A hand-off or a delivery record changes rows it names by id, and must
// reach them by id whatever the statistics say, or one partner's backlog
// slows every lane.
//
// The plans are generic (pipeline.PipelineTx), made once per session and kept
// until the next ANALYZE of the table. Statistics taken while nothing was
// pending (a quiet night, all work done) estimate no pending rows at all;
// a plan made from them for "id = ANY($1) AND status = 'pending'" walked
// a partial index of pending rows instead of the primary key, since an
// empty index costs nothing to walk. When a partner then went down and its
// backlog grew, every hand-off of every lane walked the whole backlog
// instead of reaching its rows by primary key, until autovacuum analyzed
// the table again (after a tenth of it changed).
//
// Here the statistics say nothing is pending, one session makes its plans
// (route, transform, a replay, a hold, a failed attempt, a delivery, a dead
// letter, a cancel, a cancel that marks for a running drainer, and the lane
// reads and empty checks between them), backlogs of two other lanes are
// added (a destination's and a channel's ingress lane), and the same
// statements run again: the pending indexes may give up the session's own
// few rows, never a backlog. The operator's statements are planned for their values each
// time, and their plans made the same choice.
func TestByIDWritesIgnoreStatisticsOfNoPendingRows(t *testing.T) {
	ctx, db, ins := laneTest(t)

	// The statistics stay as this test makes them.
	fixtures.Exec(t, db, `ALTER TABLE mefor_work SET (autovacuum_enabled = false)`)
	fixtures.Exec(t, db, `ALTER TABLE mefor_message SET (autovacuum_enabled = false)`)
	fixtures.Exec(t, db, `INSERT INTO mefor_message (channel, source, size, raw, status)
		SELECT 'adt', 'test', 1, 'x', 'processed' FROM generate_series(1, 2000)`)
	fixtures.Exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel, status)
		SELECT id, 'ingress', 'ingress:adt', 'adt', 'done' FROM mefor_message`)
	fixtures.Exec(t, db, `ANALYZE mefor_work, mefor_message`)

	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	conn := c.Conn()
	// reads counts, by step, the entries of the pending indexes each step
	// read; measure turns it on.
	reads := map[string]int{}
	measure := false
	inTx := func(what string, f func(tx pgx.Tx) error) {
		t.Helper()
		before := 0
		if measure {
			before = pendingReads(t, db, conn)
		}
		if err := pgx.BeginTxFunc(ctx, conn, pipeline.PipelineTx, f); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if measure {
			reads[what] += pendingReads(t, db, conn) - before
		}
	}
	// head reads lane as its drainer does, and checks what a drainer
	// checks before it lingers: those go by the lane, and the pending
	// index serves them.
	head := func(lane string) pipeline.Row {
		t.Helper()
		var rows []pipeline.Row
		inTx("read "+lane, func(tx pgx.Tx) error {
			var err error
			if rows, err = pipeline.PendingRows(ctx, tx, lane, 10); err == nil && len(rows) != 1 {
				err = fmt.Errorf("%d rows", len(rows))
			}
			return err
		})
		inTx("empty check "+lane, func(tx pgx.Tx) error {
			empty, err := pipeline.CompleteIfEmpty(ctx, tx, lane)
			if err == nil && empty {
				err = errors.New("found empty")
			}
			return err
		})
		return rows[0]
	}
	const outLane = "outbound:d"
	// life takes four messages through every write by id of the pipeline
	// and of the operator commands.
	life := func(round int) {
		t.Helper()
		for k, end := range []string{"delivered", "dead", "cancelled", "marked"} {
			ctrl := fmt.Sprintf("R%dM%d", round, k)
			step := func(what string) string { return what + " (" + end + ")" }
			_, err := pipeline.ReceiveBatch(ctx, conn, ins, []pipeline.Inbound{{Channel: "adt", Source: "test",
				Raw: []byte(strings.Replace(handoffBody, "|C1|", "|"+ctrl+"|", 1)), ControlID: ctrl, MessageType: "ADT", TriggerEvent: "A01"}})
			if err != nil {
				t.Fatalf("store %s: %v", ctrl, err)
			}
			row := head(jobs.IngressLane("adt"))
			if end == "dead" {
				inTx(step("dead-letter"), func(tx pgx.Tx) error {
					return pipeline.RouteBatch(ctx, tx, ins, pipeline.NoFence, []pipeline.Row{row},
						[]pipeline.RouteDecision{{DeadReason: "test"}})
				})
				continue
			}
			inTx(step("route"), func(tx pgx.Tx) error {
				return pipeline.RouteHandoff(ctx, tx, ins, row, []pipeline.RoutedOut{{Route: "r", Handler: "passthrough"}})
			})
			row = head(jobs.RoutedLane("adt"))
			dest, lane := "d", outLane
			if end == "marked" {
				// A lane of its own, whose row stays pending, marked.
				dest, lane = "m", fmt.Sprintf("outbound:m%d", round)
			}
			inTx(step("transform"), func(tx pgx.Tx) error {
				return pipeline.TransformHandoff(ctx, tx, ins, row, []pipeline.OutboundOut{{Destination: dest, Lane: lane, Payload: []byte("p")}})
			})
			row = head(lane)
			if end == "marked" {
				// Its drainer is running: cancel marks the row for the
				// drainer to cancel, by id.
				fixtures.Exec(t, db, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now()
					WHERE id = (SELECT job_id FROM mefor_lane WHERE name = $1)`, lane)
				inTx(step("mark"), func(tx pgx.Tx) error {
					res, err := pipeline.CancelBatch(ctx, tx, pipeline.Audit{}, pipeline.CancelFilter{Destination: dest}, 0, row.ID, 10)
					if err == nil && !slices.Contains(res.Marked, row.ID) {
						err = fmt.Errorf("marked %v, want row %d among them", res.Marked, row.ID)
					}
					return err
				})
				continue
			}
			if end == "cancelled" {
				// An operator's by-id statements: the rows it found by
				// destination, then those of them still pending.
				inTx(step("cancel"), func(tx pgx.Tx) error {
					res, err := pipeline.CancelBatch(ctx, tx, pipeline.Audit{}, pipeline.CancelFilter{Destination: "d"}, 0, row.ID, 10)
					if err == nil && res.Rows != 1 {
						err = fmt.Errorf("cancelled %d rows, want 1", res.Rows)
					}
					return err
				})
				inTx(step("marked lanes"), func(tx pgx.Tx) error {
					_, err := pipeline.MarkedLanes(ctx, tx, []int64{row.ID})
					return err
				})
				continue
			}
			inTx(step("replay"), func(tx pgx.Tx) error {
				_, err := pipeline.ReplayMessage(ctx, tx, pipeline.Audit{}, row.MessageID)
				return err
			})
			inTx(step("hold"), func(tx pgx.Tx) error {
				return pipeline.RecordHold(ctx, tx, pipeline.NoFence, row, "test", 0)
			})
			inTx(step("failed attempt"), func(tx pgx.Tx) error {
				return pipeline.Failed(ctx, tx, row, pipeline.Attempt{Outcome: "refused", Error: "test"}, 0, false)
			})
			inTx(step("delivery"), func(tx pgx.Tx) error {
				ok, err := pipeline.Delivered(ctx, tx, row, pipeline.Attempt{Outcome: "delivered", AckCode: "AA"})
				if err == nil && !ok {
					err = fmt.Errorf("row %d not recorded", row.ID)
				}
				return err
			})
		}
	}
	life(1) // the plans are made, from statistics that say nothing is pending
	// A partner that is down, and a channel whose routing stalled: a
	// backlog at the stage that a statement names by its stage too.
	const backlog = 20000
	fixtures.Exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel, destination)
		SELECT (SELECT min(id) FROM mefor_message), 'outbound', 'outbound:down', 'other', 'down'
		FROM generate_series(1, $1::int)`, backlog)
	fixtures.Exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel)
		SELECT (SELECT min(id) FROM mefor_message), 'ingress', 'ingress:other', 'other'
		FROM generate_series(1, $1::int)`, backlog)
	measure = true
	life(2)
	for what, n := range reads {
		limit := backlog / 10
		if what == "cancel (cancelled)" || what == "mark (marked)" {
			// Its first statement selects the destination's pending rows
			// in id order, which no index gives, and may read every
			// pending row of both backlogs once (pipeline.CancelBatch). What
			// it then does by id must not read them again.
			limit += 2 * backlog
		}
		if n > limit {
			t.Errorf("%s read %d entries of the pending indexes with %d rows of each of two other lanes pending, want at most %d: a statement by id walked a backlog", what, n, backlog, limit)
		}
	}
	if len(reads) != 22 {
		t.Errorf("measured %d steps, want 22: %v", len(reads), reads)
	}
	if n := count(t, db, `SELECT count(*) FROM mefor_work WHERE lane = $1 AND status = 'done'`, outLane); n != 2 {
		t.Fatalf("%d deliveries recorded, want 2", n)
	}
}

// pendingReads is how many entries of mefor_work's pending indexes the
// server has read, conn's reads included.
func pendingReads(t *testing.T, db *testcontainers.DB, conn *pgx.Conn) int {
	t.Helper()
	// The session's counts reach the statistics when it goes idle after
	// this call.
	if _, err := conn.Exec(context.Background(), `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	return count(t, db, `SELECT coalesce(sum(s.idx_tup_read), 0)::int
		FROM pg_stat_user_indexes s JOIN pg_index i ON i.indexrelid = s.indexrelid
		WHERE s.relname = 'mefor_work' AND pg_get_expr(i.indpred, i.indrelid) LIKE '%pending%'`)
}

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
