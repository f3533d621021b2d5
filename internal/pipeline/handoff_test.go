package pipeline_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

const handoffBody = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|C1|P|2.5\rPID|1||P1\r"

// A drainer reads a lane's rows, then something else ends one of them (an
// orphan sweep dead-letters it) before the drainer's hand-off commits. The
// hand-off must produce nothing for that row: a message that is dead must
// not also go on to the next stage, or a later replay would deliver it
// twice.
func TestHandoffProducesOnlyForConsumedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
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
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
