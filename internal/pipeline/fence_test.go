package pipeline_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Fence accepts only the execution River is running now: job id, state
// running and the attempted_at of that fetch. While it accepts, it holds the
// job's row, so a rescue cannot change the job before the drainer commits.
func TestFenceAcceptsOnlyTheRunningExecution(t *testing.T) {
	ctx, db, ins := laneTest(t)
	id := fixtures.Queue(t, db, ins, "outbound:f")
	at := start(t, db, id).AttemptedAt
	fence := func(jobID int64, attemptedAt time.Time) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return pipeline.Fence(ctx, tx, pipeline.Execution{JobID: jobID, AttemptedAt: attemptedAt})
		})
	}
	if err := fence(id, at); err != nil {
		t.Fatalf("running execution fenced: %v", err)
	}
	if err := fence(id, at.Add(-time.Second)); !errors.Is(err, pipeline.ErrSuperseded) {
		t.Fatalf("earlier execution of the same job: %v, want ErrSuperseded", err)
	}
	if err := fence(id+1000, at); !errors.Is(err, pipeline.ErrSuperseded) {
		t.Fatalf("unknown job: %v, want ErrSuperseded", err)
	}

	// The rescuer's update waits for the fenced transaction.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := pipeline.Fence(ctx, tx, pipeline.Execution{JobID: id, AttemptedAt: at}); err != nil {
		t.Fatal(err)
	}
	rescued := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(ctx, `UPDATE river_job SET state = 'retryable' WHERE id = $1 AND state = 'running'`, id)
		rescued <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := db.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-rescued:
			t.Fatalf("rescue changed the job while a drainer transaction held its fence (err %v)", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("rescue neither waited nor finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rescued; err != nil {
		t.Fatal(err)
	}
	if err := fence(id, at); !errors.Is(err, pipeline.ErrSuperseded) {
		t.Fatalf("rescued job: %v, want ErrSuperseded", err)
	}
}

// Every hand-off a drainer makes carries its fence: with a superseded
// execution (same job, earlier attempted_at) routing, transforming and
// recording a delivery fail with ErrSuperseded and change nothing; with the
// running execution they go through.
func TestHandoffsOfSupersededExecutionChangeNothing(t *testing.T) {
	ctx, db, ins := laneTest(t)

	// One message with a row in each stage's lane, and a running drainer.
	msg := message(t, db, "c", "received")
	fixtures.Exec(t, db, `
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination) VALUES
			($1, 'ingress', 'ingress:c', 'c', NULL, NULL, NULL),
			($1, 'routed', 'routed:c', 'c', 'r', 'h', NULL),
			($1, 'outbound', 'outbound:d', 'c', 'r', 'h', 'd')`, msg)
	current := start(t, db, fixtures.Queue(t, db, ins, "outbound:job"))
	stale := current
	stale.AttemptedAt = stale.AttemptedAt.Add(-time.Second)
	row := func(lane string) pipeline.Row {
		rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("pending row of %s: %v %v", lane, rows, err)
		}
		return rows[0]
	}
	handoffs := []struct {
		name string
		lane string
		do   func(tx pgx.Tx, ex pipeline.Execution, r pipeline.Row) error
	}{
		{"route", "ingress:c", func(tx pgx.Tx, ex pipeline.Execution, r pipeline.Row) error {
			return pipeline.RouteBatch(ctx, tx, ins, ex, []pipeline.Row{r},
				[]pipeline.RouteDecision{{Outs: []pipeline.RoutedOut{{Route: "r", Handler: "h"}}}})
		}},
		{"transform", "routed:c", func(tx pgx.Tx, ex pipeline.Execution, r pipeline.Row) error {
			return pipeline.TransformBatch(ctx, tx, ins, ex, []pipeline.Row{r},
				[]pipeline.TransformDecision{{Outs: []pipeline.OutboundOut{{Destination: "d", Lane: "outbound:d", Payload: []byte("x")}}}})
		}},
		{"deliver", "outbound:d", func(tx pgx.Tx, ex pipeline.Execution, r pipeline.Row) error {
			_, err := pipeline.RecordAttempt(ctx, tx, ex, r, pipeline.Attempt{Outcome: "delivered", AckCode: "AA"}, true, 0, false)
			return err
		}},
	}
	snapshot := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `
			SELECT format('rows [%s] events %s replies %s message %s',
				(SELECT string_agg(format('%s %s %s %s', stage, lane, status, attempts), ', ' ORDER BY id) FROM mefor_work),
				(SELECT count(*) FROM mefor_event), (SELECT count(*) FROM mefor_response),
				(SELECT status FROM mefor_message WHERE id = $1))`, msg).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, h := range handoffs {
		before := snapshot()
		r := row(h.lane)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return h.do(tx, stale, r) })
		if !errors.Is(err, pipeline.ErrSuperseded) {
			t.Fatalf("%s by a superseded execution: %v, want ErrSuperseded", h.name, err)
		}
		if after := snapshot(); after != before {
			t.Fatalf("%s by a superseded execution changed the pipeline:\n before %s\n after  %s", h.name, before, after)
		}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return h.do(tx, current, r) }); err != nil {
			t.Fatalf("%s by the running execution: %v", h.name, err)
		}
		if after := snapshot(); after == before {
			t.Fatalf("%s by the running execution changed nothing", h.name)
		}
	}
}
