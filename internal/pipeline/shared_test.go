package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Hand-offs of several drainers sent together (RunHandoffs) commit in one
// transaction or not at all: with every execution running, two channels'
// routing and a third's transform are all consumed and produced, each row
// in its own channel's lane, by one transaction; with one execution
// superseded nothing of any of them is written; begun with a lock timeout
// (pipeline.PipelineTxLockTimeout, as the workers begin them), a lane whose
// lock is held elsewhere fails the shared transaction instead of holding
// everyone's hand-offs, and writes nothing; a hand-off with transform state
// is refused a shared transaction.
func TestSharedHandoffsCommitTogetherOrNotAtAll(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
	ctx := context.Background()

	msg := func(channel, status string) int64 {
		var id int64
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ($1, 'test', 1, 'x', $2)
			RETURNING id`, channel, status).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	m1, m2, m3 := msg("c1", "received"), msg("c2", "received"), msg("c3", "routed")
	fixtures.Exec(t, db, `
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler) VALUES
			($1, 'ingress', 'ingress:c1', 'c1', NULL, NULL),
			($2, 'ingress', 'ingress:c2', 'c2', NULL, NULL),
			($3, 'routed', 'routed:c3', 'c3', 'r', 'h')`, m1, m2, m3)
	running := func(lane string) pipeline.Execution { return start(t, db, fixtures.Queue(t, db, ins, lane)) }
	ex1, ex2, ex3 := running("outbound:job1"), running("outbound:job2"), running("outbound:job3")
	row := func(lane string) []pipeline.Row {
		rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("pending row of %s: %v %v", lane, rows, err)
		}
		return rows
	}
	r1, r2, r3 := row("ingress:c1"), row("ingress:c2"), row("routed:c3")
	routed := []pipeline.RouteDecision{{Outs: []pipeline.RoutedOut{{Route: "r", Handler: "h"}}}}
	handoffs := func(ex1, ex2, ex3 pipeline.Execution) []*pipeline.Handoff {
		return []*pipeline.Handoff{
			pipeline.PrepareRoute(ex1, r1, routed),
			pipeline.PrepareRoute(ex2, r2, routed),
			pipeline.PrepareTransform(ex3, r3, []pipeline.TransformDecision{{
				Outs: []pipeline.OutboundOut{{Destination: "d", Lane: "outbound:d", Payload: []byte("x")}}}}),
		}
	}
	bounded := pipeline.PipelineTxLockTimeout(100 * time.Millisecond)
	run := func(ctx context.Context, hs []*pipeline.Handoff) error {
		return pgx.BeginTxFunc(ctx, db.Pool, bounded, func(tx pgx.Tx) error { return pipeline.RunHandoffs(ctx, tx, ins, hs...) })
	}
	snapshot := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `
			SELECT format('rows [%s] events %s messages [%s]',
				(SELECT string_agg(format('%s %s %s %s', stage, lane, channel, status), ', ' ORDER BY id) FROM mefor_work WHERE lane NOT LIKE 'outbound:job%'),
				(SELECT count(*) FROM mefor_event),
				(SELECT string_agg(status, ' ' ORDER BY id) FROM mefor_message WHERE id = ANY($1)))`,
			[]int64{m1, m2, m3}).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()

	stale := ex2
	stale.AttemptedAt = stale.AttemptedAt.Add(-time.Second)
	if err := run(ctx, handoffs(ex1, stale, ex3)); !errors.Is(err, pipeline.ErrSuperseded) {
		t.Fatalf("shared hand-offs with one superseded execution: %v, want ErrSuperseded", err)
	}
	if after := snapshot(); after != before {
		t.Fatalf("shared hand-offs with one superseded execution wrote:\n before %s\n after  %s", before, after)
	}

	// Another transaction holds routed:c2, which the second routing writes.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // a failure below must not leave the database busy
	if err := jobs.LockLanes(ctx, tx, []string{jobs.RoutedLane("c2")}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = run(waitCtx, handoffs(ex1, ex2, ex3))
	cancel()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("shared hand-offs writing a lane held elsewhere: %v, want lock_not_available (55P03) within the lock timeout", err)
	}
	tx.Rollback(ctx)
	if after := snapshot(); after != before {
		t.Fatalf("shared hand-offs that timed out on a lock wrote:\n before %s\n after  %s", before, after)
	}

	withState := pipeline.PrepareTransform(ex3, r3, []pipeline.TransformDecision{{
		State: &state.Change{Writes: []state.Write{{Key: state.Key{Namespace: "n", Key: "k"}, Value: []byte(`1`)}}}}})
	if err := run(ctx, []*pipeline.Handoff{pipeline.PrepareRoute(ex1, r1, routed), withState}); err == nil {
		t.Fatal("a hand-off with transform state shared a transaction")
	}

	if err := run(ctx, handoffs(ex1, ex2, ex3)); err != nil {
		t.Fatalf("shared hand-offs of running executions: %v", err)
	}
	want := "rows [ingress ingress:c1 c1 done, ingress ingress:c2 c2 done, routed routed:c3 c3 done, " +
		"routed routed:c1 c1 pending, routed routed:c2 c2 pending, outbound outbound:d c3 pending] events 3 messages [routed routed routed]"
	if got := snapshot(); got != want {
		t.Fatalf("after the shared hand-offs:\n got  %s\n want %s", got, want)
	}
	var xacts int
	if err := db.Pool.QueryRow(ctx, `
		SELECT count(DISTINCT xmin::text) FROM mefor_work WHERE status = 'pending' AND lane IN ('routed:c1', 'routed:c2', 'outbound:d')`).Scan(&xacts); err != nil {
		t.Fatal(err)
	}
	if xacts != 1 {
		t.Fatalf("the three hand-offs' rows were written by %d transactions, want 1", xacts)
	}
}

// Delivery records of several lanes sent together (RunHandoffs with
// PrepareRecord) share one transaction with other hand-offs and still
// answer each lane on its own: how many of its rows were recorded and
// whether rows of its lane are marked for cancelling, which its drainer
// must resolve before it sends again. With one execution superseded,
// nothing of any of them is written; a record with a failed attempt is
// refused a shared transaction.
func TestSharedRecordsAnswerEachLane(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
	ctx := context.Background()

	for _, lane := range []string{"outbound:a", "outbound:a", "outbound:b", "outbound:b"} {
		fixtures.Queue(t, db, ins, lane)
	}
	exA, exB := start(t, db, fixtures.Queue(t, db, ins, "outbound:a")), start(t, db, fixtures.Queue(t, db, ins, "outbound:b"))
	var m1 int64
	if err := db.Pool.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('c1', 'test', 1, 'x', 'received')
		RETURNING id`).Scan(&m1); err != nil {
		t.Fatal(err)
	}
	fixtures.Exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel) VALUES ($1, 'ingress', 'ingress:c1', 'c1')`, m1)
	ex1 := start(t, db, fixtures.Queue(t, db, ins, "outbound:job1"))
	rows := func(lane string, n int) []pipeline.Row {
		rows, err := pipeline.PendingRows(ctx, db.Pool, lane, n)
		if err != nil || len(rows) != n {
			t.Fatalf("%d pending rows of %s: %v %v", n, lane, rows, err)
		}
		return rows
	}
	rowsA, rowsB, r1 := rows("outbound:a", 3), rows("outbound:b", 3), rows("ingress:c1", 1)
	// An operator cancels B's last row while its drainer sends the others.
	fixtures.Exec(t, db, `UPDATE mefor_work SET cancel_requested_at = now() WHERE id = $1`, rowsB[2].ID)
	delivered := func(rows []pipeline.Row) []pipeline.Outcome {
		var outs []pipeline.Outcome
		for _, r := range rows {
			outs = append(outs, pipeline.Outcome{Row: r, Delivered: true, Attempt: pipeline.Attempt{Outcome: "delivered", AckCode: "AA"}})
		}
		return outs
	}
	routed := []pipeline.RouteDecision{{Outs: []pipeline.RoutedOut{{Route: "r", Handler: "h"}}}}
	run := func(hs ...*pipeline.Handoff) error {
		return pgx.BeginTxFunc(ctx, db.Pool, pipeline.PipelineTxLockTimeout(100*time.Millisecond), func(tx pgx.Tx) error {
			return pipeline.RunHandoffs(ctx, tx, ins, hs...)
		})
	}
	snapshot := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `
			SELECT format('rows [%s] events %s responses %s messages [%s]',
				(SELECT string_agg(format('%s %s', lane, status), ', ' ORDER BY id) FROM mefor_work WHERE lane NOT LIKE 'outbound:job%'),
				(SELECT count(*) FROM mefor_event), (SELECT count(*) FROM mefor_response),
				(SELECT string_agg(status, ' ' ORDER BY id) FROM mefor_message))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()

	stale := exB
	stale.AttemptedAt = stale.AttemptedAt.Add(-time.Second)
	if err := run(pipeline.PrepareRoute(ex1, r1, routed), pipeline.PrepareRecord(exA, delivered(rowsA)),
		pipeline.PrepareRecord(stale, delivered(rowsB[:2]))); !errors.Is(err, pipeline.ErrSuperseded) {
		t.Fatalf("shared records with one superseded execution: %v, want ErrSuperseded", err)
	}
	if after := snapshot(); after != before {
		t.Fatalf("shared records with one superseded execution wrote:\n before %s\n after  %s", before, after)
	}

	failed := pipeline.PrepareRecord(exB, []pipeline.Outcome{{Row: rowsB[0], Attempt: pipeline.Attempt{Outcome: "refused", Error: "test"}}})
	if failed.Shareable() {
		t.Fatal("a record with a failed attempt is shareable")
	}
	if err := run(pipeline.PrepareRecord(exA, delivered(rowsA)), failed); err == nil {
		t.Fatal("a record with a failed attempt shared a transaction")
	}

	// B's record leaves out its cancelled row; A's also holds a row
	// someone else ended meanwhile.
	fixtures.Exec(t, db, `UPDATE mefor_work SET status = 'cancelled', finished_at = now() WHERE id = $1`, rowsA[2].ID)
	recA, recB := pipeline.PrepareRecord(exA, delivered(rowsA)), pipeline.PrepareRecord(exB, delivered(rowsB[:2]))
	if err := run(pipeline.PrepareRoute(ex1, r1, routed), recA, recB); err != nil {
		t.Fatalf("shared records of running executions: %v", err)
	}
	if got, want := recA.Recorded(), (pipeline.Recorded{Rows: 2}); got != want {
		t.Errorf("lane a's record: %+v, want %+v (one of its rows was no longer pending)", got, want)
	}
	if got, want := recB.Recorded(), (pipeline.Recorded{Recorded: true, Rows: 2, CancelsPending: true}); got != want {
		t.Errorf("lane b's record: %+v, want %+v (a row of its lane is marked for cancelling)", got, want)
	}
	want := "rows [outbound:a done, outbound:a done, outbound:b done, outbound:b done, outbound:a cancelled, outbound:b pending, " +
		"ingress:c1 done, routed:c1 pending] events 5 responses 4 messages [processed processed processed processed processed routed routed routed]"
	if got := snapshot(); got != want {
		t.Errorf("after the shared records:\n got  %s\n want %s", got, want)
	}
	xacts := 0
	if err := db.Pool.QueryRow(ctx, `
		SELECT count(DISTINCT xmin::text) FROM (
			SELECT xmin FROM mefor_event UNION ALL SELECT xmin FROM mefor_response
			UNION ALL SELECT xmin FROM mefor_work WHERE lane = 'routed:c1') x`).Scan(&xacts); err != nil {
		t.Fatal(err)
	}
	if xacts != 1 {
		t.Errorf("the route hand-off and both lanes' records were written by %d transactions, want 1", xacts)
	}
}
