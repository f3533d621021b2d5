package ops_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
)

// Operator writes racing each other and the pipeline's own hand-offs
// (intake, route, transform, delivered, failed, dead-lettered) neither
// deadlock nor fail, leave every message with the status the finalizer
// rules give its rows, and leave the summary counts equal to count(*).
func TestOperatorWritesRaceThePipeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(e.ctx, 4*time.Second)
	defer cancel()
	pool := e.db.Pool
	lanes := []string{"outbound:lab#0", "outbound:lab#1"}

	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) }
	produce := func(i int) error {
		var id int64
		err := inTx(func(tx pgx.Tx) error {
			var err error
			id, err = pipeline.Receive(ctx, tx, e.q, pipeline.Inbound{Channel: "adt", Source: "test", Raw: []byte("MSH|x"), ControlID: fmt.Sprint(i)})
			return err
		})
		if err != nil {
			return err
		}
		rows, err := pipeline.PendingRows(ctx, pool, jobs.IngressLane("adt"), 1000)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.MessageID == id {
				if err := inTx(func(tx pgx.Tx) error {
					return pipeline.RouteHandoff(ctx, tx, e.q, r, []pipeline.RoutedOut{{Route: "r", Handler: "h"}})
				}); err != nil {
					return err
				}
			}
		}
		rows, err = pipeline.PendingRows(ctx, pool, jobs.RoutedLane("adt"), 1000)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.MessageID == id {
				return inTx(func(tx pgx.Tx) error {
					return pipeline.TransformHandoff(ctx, tx, e.q, r, []pipeline.OutboundOut{
						{Destination: "lab", Lane: lanes[i%2]}, {Destination: "lab", Lane: lanes[(i+1)%2]}})
				})
			}
		}
		return nil
	}
	deliver := func(rng *rand.Rand) error {
		rows, err := pipeline.PendingRows(ctx, pool, lanes[rng.IntN(2)], 1)
		if err != nil || len(rows) == 0 {
			return err
		}
		a := pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: "rejected"}
		return inTx(func(tx pgx.Tx) error {
			switch rng.IntN(3) {
			case 0:
				_, err := pipeline.Delivered(ctx, tx, rows[0], pipeline.Attempt{Outcome: "delivered", AckCode: "AA"})
				return err
			case 1:
				return pipeline.Failed(ctx, tx, rows[0], a, 0, false)
			default:
				return pipeline.Failed(ctx, tx, rows[0], a, 0, true)
			}
		})
	}

	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	loop := func(name string, fn func(rng *rand.Rand, i int) error) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(len(name)), 7))
			for i := 0; ctx.Err() == nil; i++ {
				if err := fn(rng, i); err != nil && ctx.Err() == nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	for range 2 {
		loop("produce", func(_ *rand.Rand, i int) error { return produce(i) })
		loop("deliver", func(rng *rand.Rand, _ int) error { return deliver(rng) })
	}
	loop("replay-dead", func(_ *rand.Rand, _ int) error {
		_, err := ops.ReplayDead(ctx, pool, e.q, pipeline.DeadFilter{Destination: "lab"}, ops.BulkOptions{BatchSize: 3})
		return err
	})
	loop("replay", func(rng *rand.Rand, _ int) error {
		var max int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM mefor_message").Scan(&max); err != nil || max == 0 {
			return err
		}
		_, err := ops.Replay(ctx, pool, e.q, 1+rng.Int64N(max))
		return err
	})
	loop("cancel", func(rng *rand.Rand, _ int) error {
		time.Sleep(20 * time.Millisecond)
		_, err := ops.Cancel(ctx, pool, e.q, pipeline.CancelFilter{Destination: "lab", Top: rng.IntN(4) != 0}, ops.BulkOptions{BatchSize: 2})
		return err
	})
	loop("fold counts", func(_ *rand.Rand, _ int) error {
		time.Sleep(10 * time.Millisecond)
		_, err := pipeline.FoldCounts(ctx, pool)
		return err
	})
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}

	// Every message's status is what the finalizer rules give its rows.
	rows, err := e.db.Pool.Query(e.ctx, `
		SELECT m.id, m.status,
			bool_or(w.status = 'pending'), bool_or(w.status = 'dead'), bool_or(w.stage = 'outbound')
		FROM mefor_message m JOIN mefor_work w ON w.message_id = m.id
		GROUP BY m.id, m.status`)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	var status string
	var pending, dead, outbound bool
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&id, &status, &pending, &dead, &outbound}, func() error {
		n++
		want := map[bool]string{true: "error", false: "processed"}[dead]
		switch {
		case pending && (status == "received" || status == "routed"):
			return nil
		case pending:
			return fmt.Errorf("message %d has pending rows but status %s", id, status)
		case !outbound:
			return nil // still between stages when the test stopped
		case status != want:
			return fmt.Errorf("message %d: status %s, rows say %s", id, status, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("only %d messages went through; the race did not run", n)
	}
	// The summary counts kept up with every racing writer and fold.
	if err := pipeline.VerifyCounts(e.ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages", n)
}
