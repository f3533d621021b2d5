package workers_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/workers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

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
	return laneJob(t, db, lane)
}

func laneJob(t *testing.T, db *testcontainers.DB, lane string) int64 {
	t.Helper()
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT job_id FROM mefor_lane WHERE name = $1`, lane).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func jobState(t *testing.T, db *testcontainers.DB, id int64) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "deleted"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Reclaim gives a new drainer to every lane with backlog whose drainer is
// gone (discarded, cancelled, deleted) and leaves alone lanes whose drainer
// is live and lanes with nothing pending.
func TestReclaimActivatesOnlyStrandedLanes(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
	d := &workers.Deps{Pool: db.Pool, Logger: slog.New(slog.DiscardHandler)}

	discarded := queue(t, db, ins, "outbound:discarded")
	exec(t, db, `UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, discarded)
	cancelled := queue(t, db, ins, "outbound:cancelled")
	exec(t, db, `UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE id = $1`, cancelled)
	deleted := queue(t, db, ins, "outbound:deleted")
	exec(t, db, `DELETE FROM river_job WHERE id = $1`, deleted)
	live := queue(t, db, ins, "outbound:live")
	exec(t, db, `UPDATE river_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour' WHERE id = $1`, live)
	idle := queue(t, db, ins, "outbound:idle")
	exec(t, db, `UPDATE mefor_work SET status = 'done' WHERE lane = 'outbound:idle'`)
	exec(t, db, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, idle)

	n, err := workers.Reclaim(context.Background(), d, ins)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("reclaim activated %d lanes, want 3", n)
	}
	for lane, old := range map[string]int64{"outbound:discarded": discarded, "outbound:cancelled": cancelled, "outbound:deleted": deleted} {
		if id := laneJob(t, db, lane); id == old || jobState(t, db, id) != "available" {
			t.Fatalf("lane %s: drainer %d (%s), want a new available one", lane, id, jobState(t, db, id))
		}
	}
	if id := laneJob(t, db, "outbound:live"); id != live || jobState(t, db, id) != "scheduled" {
		t.Fatalf("live lane's drainer replaced or changed: %d %s", id, jobState(t, db, id))
	}
	if id := laneJob(t, db, "outbound:idle"); id != idle || jobState(t, db, id) != "completed" {
		t.Fatalf("idle lane activated: %d %s", id, jobState(t, db, id))
	}
	if n, err := workers.Reclaim(context.Background(), d, ins); err != nil || n != 0 {
		t.Fatalf("second reclaim activated %d lanes (%v), want 0", n, err)
	}
}

// store.Fence accepts only the execution River is running now: job id, state
// running and the attempted_at of that fetch. While it accepts, it holds the
// job's row, so a rescue cannot change the job before the drainer commits.
func TestFenceAcceptsOnlyTheRunningExecution(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
	ctx := context.Background()
	id := queue(t, db, ins, "outbound:f")
	var at time.Time
	if err := db.Pool.QueryRow(ctx, `
		UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1
		RETURNING attempted_at`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	fence := func(jobID int64, attemptedAt time.Time) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.Fence(ctx, tx, jobID, attemptedAt) })
	}
	if err := fence(id, at); err != nil {
		t.Fatalf("running execution fenced: %v", err)
	}
	if err := fence(id, at.Add(-time.Second)); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("earlier execution of the same job: %v, want ErrFenced", err)
	}
	if err := fence(id+1000, at); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("unknown job: %v, want ErrFenced", err)
	}

	// The rescuer's update waits for the fenced transaction.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := store.Fence(ctx, tx, id, at); err != nil {
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
	if err := fence(id, at); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("rescued job: %v, want ErrFenced", err)
	}
}

// Every hand-off a drainer makes carries its fence: with a superseded
// execution (same job, earlier attempted_at) routing, transforming and
// recording a delivery fail with ErrFenced and change nothing; with the
// running execution they go through.
func TestHandoffsOfSupersededExecutionChangeNothing(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
	ctx := context.Background()

	// One message with a row in each stage's lane, and a running drainer.
	var msg int64
	if err := db.Pool.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('c', 'test', 1, 'x', 'received')
		RETURNING id`).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	exec(t, db, `
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination) VALUES
			($1, 'ingress', 'ingress:c', 'c', NULL, NULL, NULL),
			($1, 'routed', 'routed:c', 'c', 'r', 'h', NULL),
			($1, 'outbound', 'outbound:d', 'c', 'r', 'h', 'd')`, msg)
	id := queue(t, db, ins, "outbound:job")
	var at time.Time
	if err := db.Pool.QueryRow(ctx, `
		UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1
		RETURNING attempted_at`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	current := store.Execution{JobID: id, AttemptedAt: at}
	stale := store.Execution{JobID: id, AttemptedAt: at.Add(-time.Second)}
	row := func(lane string) store.WorkRow {
		rows, err := store.PendingRows(ctx, db.Pool, lane, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("pending row of %s: %v %v", lane, rows, err)
		}
		return rows[0]
	}
	handoffs := []struct {
		name string
		lane string
		do   func(tx pgx.Tx, ex store.Execution, r store.WorkRow) error
	}{
		{"route", "ingress:c", func(tx pgx.Tx, ex store.Execution, r store.WorkRow) error {
			return store.RouteBatch(ctx, tx, ins, ex, []store.WorkRow{r},
				[]store.RouteDecision{{Outs: []store.RoutedOut{{Route: "r", Handler: "h"}}}})
		}},
		{"transform", "routed:c", func(tx pgx.Tx, ex store.Execution, r store.WorkRow) error {
			return store.TransformBatch(ctx, tx, ins, ex, []store.WorkRow{r},
				[]store.TransformDecision{{Outs: []store.OutboundOut{{Destination: "d", Lane: "outbound:d", Payload: []byte("x")}}}})
		}},
		{"deliver", "outbound:d", func(tx pgx.Tx, ex store.Execution, r store.WorkRow) error {
			_, err := store.RecordAttempt(ctx, tx, ex, r, store.Attempt{Outcome: "delivered", AckCode: "AA"}, true, 0, false)
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
		if !errors.Is(err, store.ErrFenced) {
			t.Fatalf("%s by a superseded execution: %v, want ErrFenced", h.name, err)
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
