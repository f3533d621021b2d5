package pipeline_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A reply is produced only with the delivery record that accepts it: a
// record that finds its row no longer pending (already delivered, or
// cancelled) routes nothing, so a reply is never stored twice and never
// for a delivery that was not recorded.
func TestReplyOnlyWithTheDeliveryRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
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
