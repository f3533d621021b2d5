package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// These tests hold hand-offs and delivery records to what they may write:
// only for the rows they consumed, a reply only with the record that
// accepts it, and several drainers' hand-offs in one transaction all or
// nothing, each lane answered on its own.

const handoffBody = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|C1|P|2.5\rPID|1||P1\r"

// A drainer reads a lane's rows, then something else ends one of them (an
// orphan sweep dead-letters it) before the drainer's hand-off commits. The
// hand-off must produce nothing for that row: a message that is dead must
// not also go on to the next stage, or a later replay would deliver it
// twice.
func TestHandoffProducesOnlyForConsumedRows(t *testing.T) {
	ctx, db, ins := laneTest(t)
	inTx := func(t *testing.T, fn func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db.Pool, fn); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(t *testing.T, channel string) int64 {
		t.Helper()
		var id int64
		inTx(t, func(tx pgx.Tx) error {
			var err error
			id, err = pipeline.Receive(ctx, tx, ins, pipeline.Inbound{Channel: channel, Source: "test",
				Raw: []byte(handoffBody), ControlID: "C1", MessageType: "ADT", TriggerEvent: "A01"})
			return err
		})
		return id
	}
	read := func(t *testing.T, lane string) []pipeline.Row {
		t.Helper()
		rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 10)
		if err != nil || len(rows) != 1 {
			t.Fatalf("read %s: %d rows, %v", lane, len(rows), err)
		}
		return rows
	}
	deadLetter := func(t *testing.T, row pipeline.Row) {
		t.Helper()
		inTx(t, func(tx pgx.Tx) error {
			return pipeline.DeadLetter(ctx, tx, pipeline.NoFence, row, "removed by an operator")
		})
	}
	check := func(t *testing.T, msg int64, stage, event string) {
		t.Helper()
		if n := count(t, db, "SELECT count(*) FROM mefor_work WHERE message_id = $1 AND stage = $2", msg, stage); n != 0 {
			t.Errorf("the hand-off of a dead-lettered row produced %d %s row(s)", n, stage)
		}
		if n := count(t, db, "SELECT count(*) FROM mefor_event WHERE message_id = $1 AND event = $2", msg, event); n != 0 {
			t.Errorf("the hand-off of a dead-lettered row recorded a %s event", event)
		}
		var status string
		if err := db.Pool.QueryRow(ctx, "SELECT status FROM mefor_message WHERE id = $1", msg).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != pipeline.StatusError {
			t.Errorf("message status %q, want %q: its only row is dead", status, pipeline.StatusError)
		}
	}

	t.Run("route", func(t *testing.T) {
		msg := receive(t, "adt1")
		rows := read(t, jobs.IngressLane("adt1"))
		deadLetter(t, rows[0])
		inTx(t, func(tx pgx.Tx) error {
			return pipeline.RouteBatch(ctx, tx, ins, pipeline.NoFence, rows,
				[]pipeline.RouteDecision{{Outs: []pipeline.RoutedOut{{Route: "all", Handler: "passthrough"}}}})
		})
		check(t, msg, "routed", pipeline.EventRouted)
	})

	t.Run("transform", func(t *testing.T) {
		msg := receive(t, "adt2")
		inTx(t, func(tx pgx.Tx) error {
			return pipeline.RouteHandoff(ctx, tx, ins, read(t, jobs.IngressLane("adt2"))[0],
				[]pipeline.RoutedOut{{Route: "all", Handler: "passthrough"}})
		})
		rows := read(t, jobs.RoutedLane("adt2"))
		deadLetter(t, rows[0])
		inTx(t, func(tx pgx.Tx) error {
			return pipeline.TransformBatch(ctx, tx, ins, pipeline.NoFence, rows,
				[]pipeline.TransformDecision{{Outs: []pipeline.OutboundOut{{Destination: "lab", Lane: "outbound:lab", Payload: []byte("MSH|x")}}}})
		})
		check(t, msg, "outbound", pipeline.EventTransformed)
	})
}

func count(t *testing.T, db *testcontainers.DB, sql string, args ...any) int {
	t.Helper()
	return int(fixtures.Count(t, db.Pool, sql, args...))
}

// A reply is produced only with the delivery record that accepts it: a
// record that finds its row no longer pending (already delivered, or
// cancelled) routes nothing, so a reply is never stored twice and never
// for a delivery that was not recorded.
func TestReplyOnlyWithTheDeliveryRecorded(t *testing.T) {
	ctx, db, ins := laneTest(t)
	fixtures.Queue(t, db, ins, "outbound:d")
	fixtures.Queue(t, db, ins, "outbound:d")
	rows, err := pipeline.PendingRows(ctx, db.Pool, "outbound:d", 10)
	if err != nil || len(rows) != 2 {
		t.Fatalf("read lane: %d rows, %v", len(rows), err)
	}
	ack := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ACK^A01|R1|P|2.5\rMSA|AA|C1\r"
	deliver := func(row pipeline.Row) bool {
		t.Helper()
		var ok bool
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			ok, err = pipeline.Delivered(ctx, tx, row, pipeline.Attempt{Outcome: "delivered", AckCode: "AA", Reply: []byte(ack),
				ReplyTo: &pipeline.ReplyRoute{Channel: "replies", MaxDepth: 8, Ins: ins, ControlID: "R1", MessageType: "ACK"}})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	replies := func() int {
		return count(t, db, "SELECT count(*) FROM mefor_message WHERE channel = 'replies'")
	}

	if !deliver(rows[0]) || replies() != 1 {
		t.Fatalf("first record: %d replies, want 1", replies())
	}
	if deliver(rows[0]) || replies() != 1 {
		t.Fatalf("recording the same delivery again stored a reply: %d replies, want 1", replies())
	}
	fixtures.Exec(t, db, "UPDATE mefor_work SET status = 'cancelled' WHERE id = $1", rows[1].ID)
	if deliver(rows[1]) || replies() != 1 {
		t.Fatalf("a record of a cancelled row stored a reply: %d replies, want 1", replies())
	}
	var lane string
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT w.lane, count(*) OVER () FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE m.channel = 'replies'`).Scan(&lane, &n); err != nil || lane != "ingress:replies" || n != 1 {
		t.Fatalf("reply's ingress row: lane %q, %d rows, %v", lane, n, err)
	}
	if c := count(t, db, "SELECT count(*) FROM mefor_lane l JOIN river_job j ON j.id = l.job_id WHERE l.name = 'ingress:replies'"); c != 1 {
		t.Fatalf("the replies lane has %d drainers, want it activated", c)
	}
}

// Hand-offs of several drainers sent together (RunHandoffs) commit in one
// transaction or not at all: with every execution running, two channels'
// routing and a third's transform are all consumed and produced, each row
// in its own channel's lane, by one transaction; with one execution
// superseded nothing of any of them is written; begun with a lock timeout
// (pipeline.PipelineTxTimeouts, as the workers begin them), a lane whose
// lock is held elsewhere fails the shared transaction instead of holding
// everyone's hand-offs, and writes nothing; a hand-off with transform state
// is refused a shared transaction.
func TestSharedHandoffsCommitTogetherOrNotAtAll(t *testing.T) {
	ctx, db, ins := laneTest(t)

	m1, m2, m3 := message(t, db, "c1", "received"), message(t, db, "c2", "received"), message(t, db, "c3", "routed")
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
	bounded := pipeline.PipelineTxTimeouts(dbpool.Handoff)
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
	ctx, db, ins := laneTest(t)

	for _, lane := range []string{"outbound:a", "outbound:a", "outbound:b", "outbound:b"} {
		fixtures.Queue(t, db, ins, lane)
	}
	exA, exB := start(t, db, fixtures.Queue(t, db, ins, "outbound:a")), start(t, db, fixtures.Queue(t, db, ins, "outbound:b"))
	received(t, db, "c1")
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
		return pgx.BeginTxFunc(ctx, db.Pool, pipeline.PipelineTxTimeouts(dbpool.Handoff), func(tx pgx.Tx) error {
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
