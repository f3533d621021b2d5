package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkCountsWriteCost is what the summary-count triggers add to each
// message's writes. It takes messages through the pipeline's own
// transactions (intake, route, transform, delivered: four per message),
// alternately with the triggers enabled and disabled on one database, and
// prints per message the delta rows appended, the WAL bytes and the wall
// time of each mode, and their ratios:
//
//	BENCH counts-write-cost msgs=… count_rows_per_msg_on=… wal_bytes_per_msg_on=… wal_bytes_per_msg_off=… … us_per_msg_ratio=…
//
// MEFOR_BENCH_MESSAGES sets the messages per round (default 1,000; eight
// rounds, so that load from elsewhere on the machine falls on both modes). Run it on its own:
//
//	go test -run '^$' -bench CountsWriteCost -benchtime 1x ./internal/pipeline/
func BenchmarkCountsWriteCost(b *testing.B) {
	n := fixtures.BenchMessages(1000)
	ctx := context.Background()
	for range b.N {
		db := fixtures.BenchDB(b, nil)
		q, err := ops.NewQueue(db.Pool, nil)
		if err != nil {
			b.Fatal(err)
		}
		type totals struct {
			wal, deltas, rows int64
			took              time.Duration
			msgs              int
		}
		res := map[bool]*totals{true: {}, false: {}}
		b.StartTimer()
		for round := range 8 {
			on := round%2 == 0
			mode := "ENABLE"
			if !on {
				mode = "DISABLE"
			}
			for _, t := range []string{"mefor_message", "mefor_work"} {
				if _, err := db.Pool.Exec(ctx, "ALTER TABLE "+t+" "+mode+" TRIGGER USER"); err != nil {
					b.Fatal(err)
				}
			}
			wal0, tup0, x0 := writeStats(b, db)
			t0 := time.Now()
			runPipeline(b, db, q, round, n)
			took := time.Since(t0)
			wal1, tup1, x1 := writeStats(b, db)
			r := res[on]
			r.wal += wal1 - wal0
			r.deltas += tup1 - tup0
			r.rows += x1 - x0
			r.took += took
			r.msgs += n
		}
		b.StopTimer()
		on, off := res[true], res[false]
		per := func(v int64, t *totals) float64 { return float64(v) / float64(t.msgs) }
		us := func(t *totals) float64 { return float64(t.took.Microseconds()) / float64(t.msgs) }
		fmt.Printf("BENCH counts-write-cost msgs=%d stage_rows_per_msg=%.2f count_rows_per_msg_on=%.2f count_rows_per_msg_off=%.2f "+
			"wal_bytes_per_msg_on=%.0f wal_bytes_per_msg_off=%.0f us_per_msg_on=%.0f us_per_msg_off=%.0f wal_ratio=%.3f us_per_msg_ratio=%.3f\n",
			on.msgs+off.msgs, per(on.rows, on), per(on.deltas, on), per(off.deltas, off),
			per(on.wal, on), per(off.wal, off), us(on), us(off),
			per(on.wal, on)/per(off.wal, off), us(on)/us(off))
		if err := pipeline.VerifyCounts(ctx, db.Pool); err == nil {
			b.Error("counts agree although half the rounds ran without triggers: the benchmark did not disable them")
		}
	}
}

// runPipeline takes n messages of channel "adt" through intake, routing,
// transformation and delivery to lane outbound:lab, one transaction per
// message and stage, as the drainers do under light load.
func runPipeline(b *testing.B, db *testcontainers.DB, q jobs.Inserter, round, n int) {
	b.Helper()
	ctx := context.Background()
	inTx := func(fn func(tx pgx.Tx) error) {
		if err := pgx.BeginFunc(ctx, db.Pool, fn); err != nil {
			b.Fatal(err)
		}
	}
	for i := range n {
		inTx(func(tx pgx.Tx) error {
			_, err := pipeline.Receive(ctx, tx, q, pipeline.Inbound{Channel: "adt", Source: "bench", ControlID: fmt.Sprintf("R%dM%d", round, i),
				MessageType: "ADT", TriggerEvent: "A01",
				Raw: fmt.Appendf(nil, "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|R%dM%d|P|2.5\rPID|1||P%d\r", round, i, i)})
			return err
		})
	}
	stage := func(lane string, fn func(tx pgx.Tx, r pipeline.Row) error) {
		for {
			rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 500)
			if err != nil {
				b.Fatal(err)
			}
			if len(rows) == 0 {
				return
			}
			for _, r := range rows {
				inTx(func(tx pgx.Tx) error { return fn(tx, r) })
			}
		}
	}
	stage(jobs.IngressLane("adt"), func(tx pgx.Tx, r pipeline.Row) error {
		return pipeline.RouteHandoff(ctx, tx, q, r, []pipeline.RoutedOut{{Route: "r", Handler: "h"}})
	})
	stage(jobs.RoutedLane("adt"), func(tx pgx.Tx, r pipeline.Row) error {
		return pipeline.TransformHandoff(ctx, tx, q, r, []pipeline.OutboundOut{{Destination: "lab", Lane: "outbound:lab", Payload: []byte("MSH|out")}})
	})
	stage("outbound:lab", func(tx pgx.Tx, r pipeline.Row) error {
		_, err := pipeline.Delivered(ctx, tx, r, pipeline.Attempt{Outcome: "delivered", AckCode: "AA"})
		return err
	})
}

// writeStats is the server's WAL position (the test server holds only
// this benchmark's database), the delta rows in the count tables, and the
// stage rows written.
func writeStats(b *testing.B, db *testcontainers.DB) (wal, deltas, rows int64) {
	b.Helper()
	err := db.Pool.QueryRow(context.Background(), `
		SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
			(SELECT count(*) FROM mefor_message_count) + (SELECT count(*) FROM mefor_work_count),
			(SELECT count(*) FROM mefor_work)`).Scan(&wal, &deltas, &rows)
	if err != nil {
		b.Fatal(err)
	}
	return wal, deltas, rows
}
