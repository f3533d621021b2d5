package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)

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
					res, err := pipeline.CancelBatch(ctx, tx, pipeline.CancelFilter{Destination: dest}, 0, row.ID, 10)
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
					res, err := pipeline.CancelBatch(ctx, tx, pipeline.CancelFilter{Destination: "d"}, 0, row.ID, 10)
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
				_, err := pipeline.ReplayMessage(ctx, tx, ins, row.MessageID)
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
