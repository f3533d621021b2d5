package ops_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/retention"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
)

// These tests hold the summary counts behind `mefor status` to a full
// count(*) of the tables, after every kind of write and while operator
// writes race the pipeline.

// The numbers `mefor status` shows come from summary counts kept by
// triggers; after every kind of write the pipeline, the operator and
// retention make, they equal a full count(*) of the tables, whether or
// not the counts were folded in between.
func TestStatusCountsExactAfterMix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	check := func(step string) {
		t.Helper()
		if err := pipeline.VerifyCounts(e.ctx, e.db.Pool); err != nil {
			t.Fatalf("after %s: %v", step, err)
		}
		e.checkStatusByFullCount(step)
	}
	check("nothing")

	// Intake, route, transform, delivery, a retry, dead letters, a
	// partitioned lane and a message that did not parse.
	e.receive("adt")
	var done, dead []int64
	for range 3 {
		done = append(done, e.toOutbound("adt", lab, "outbound:x#1"))
		dead = append(dead, e.toOutbound("orm", lab))
	}
	e.tx(func(tx pgx.Tx) error {
		_, err := pipeline.Receive(e.ctx, tx, e.q, pipeline.Inbound{Channel: "adt", Source: "test", Raw: []byte("garbage"), ParseError: "no MSH"})
		return err
	})
	check("intake and hand-offs")
	for _, m := range done {
		e.deliver(lab, m)
	}
	e.fail("outbound:x#1", done[0], false, 0)
	for _, m := range dead {
		e.fail(lab, m, true, 0)
	}
	check("deliveries and dead letters")
	if _, err := pipeline.FoldCounts(e.ctx, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	check("a fold")

	// Operator writes: replay of a processed message, replay-dead, cancel.
	e.deliver("outbound:x#1", done[1])
	e.replay(done[1])
	if _, err := ops.ReplayDead(e.ctx, e.db.Pool, pipeline.DeadFilter{Channel: "orm"}, ops.BulkOptions{BatchSize: 2}); err != nil {
		t.Fatal(err)
	}
	check("replays")
	e.cancel(pipeline.CancelFilter{Destination: "x"}, ops.BulkOptions{})
	e.fail(lab, dead[0], true, 0)
	check("cancel")

	// Retention purges the bodies of some messages and deletes others
	// with all their rows.
	e.exec(`UPDATE mefor_message SET received_at = received_at - interval '100 days' WHERE id = ANY($1)`, []int64{done[2], dead[0]})
	e.exec(`UPDATE mefor_message SET received_at = received_at - interval '10 days' WHERE id = $1`, done[0])
	if _, err := pipeline.FoldCounts(e.ctx, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	res, err := retention.Run(e.ctx, e.db.Pool, retention.Policy{KeepBodies: 5 * 24 * time.Hour, DeleteAfter: 50 * 24 * time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.MessagesDeleted == 0 || res.BodiesNulled == 0 {
		t.Fatalf("retention = %+v; the test needs deletions and purges", res)
	}
	check("retention")
	for range 2 { // the second fold has nothing left to fold
		if _, err := pipeline.FoldCounts(e.ctx, e.db.Pool); err != nil {
			t.Fatal(err)
		}
		check("a fold after retention")
	}
	if n := e.queryInt(`SELECT count(*) FROM mefor_work_count`) + e.queryInt(`SELECT count(*) FROM mefor_message_count`); n != e.queryInt(`
		SELECT (SELECT count(*) FROM (SELECT DISTINCT stage, channel, destination, lane, status FROM mefor_work_count) k)
			+ (SELECT count(*) FROM (SELECT DISTINCT channel, status FROM mefor_message_count) k)`) {
		t.Fatalf("after a fold the counts hold %d rows, more than one per key", n)
	}
}

// checkStatusByFullCount compares ops.Status with the same numbers counted
// from every row, the way status counted them before it had summary
// counts.
func (e *env) checkStatusByFullCount(step string) {
	e.t.Helper()
	st, err := ops.Status(e.ctx, e.db.Pool)
	if err != nil {
		e.t.Fatal(err)
	}
	type chWant struct {
		received, queued int64
		by               map[string]int64
		oldest           *float64
	}
	want := map[string]*chWant{}
	ch := func(name string) *chWant {
		if want[name] == nil {
			want[name] = &chWant{by: map[string]int64{}}
		}
		return want[name]
	}
	rows, err := e.db.Pool.Query(e.ctx, `SELECT channel, status, count(*) FROM mefor_message GROUP BY channel, status`)
	if err != nil {
		e.t.Fatal(err)
	}
	var name, status string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &status, &n}, func() error {
		c := ch(name)
		c.received += n
		c.by[status] = n
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	var age float64
	rows, err = e.db.Pool.Query(e.ctx, `
		SELECT channel, count(*), extract(epoch FROM clock_timestamp() - min(created_at))::float8
		FROM mefor_work WHERE status = 'pending' AND stage IN ('ingress', 'routed') GROUP BY channel`)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&name, &n, &age}, func() error {
		c := ch(name)
		c.queued = n
		a := age
		c.oldest = &a
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	if len(st.Channels) != len(want) {
		e.t.Fatalf("after %s: status shows %d channels, the tables hold %d", step, len(st.Channels), len(want))
	}
	for _, c := range st.Channels {
		w := want[c.Channel]
		if w == nil || c.Received != w.received || c.Queued != w.queued || !sameAge(c.OldestQueuedSeconds, w.oldest) {
			e.t.Fatalf("after %s: channel %+v, tables say %+v", step, c, w)
		}
		for s, n := range w.by {
			if c.ByStatus[s] != n {
				e.t.Fatalf("after %s: channel %s has %d %s, tables say %d", step, c.Channel, c.ByStatus[s], s, n)
			}
		}
		if len(c.ByStatus) != len(w.by) {
			e.t.Fatalf("after %s: channel %s by status %v, tables say %v", step, c.Channel, c.ByStatus, w.by)
		}
	}

	rows, err = e.db.Pool.Query(e.ctx, `
		SELECT destination, count(DISTINCT lane)::int,
			count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'done'),
			count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'cancelled'),
			extract(epoch FROM clock_timestamp() - min(created_at) FILTER (WHERE status = 'pending'))::float8
		FROM mefor_work WHERE stage = 'outbound' GROUP BY destination ORDER BY destination`)
	if err != nil {
		e.t.Fatal(err)
	}
	var wantD []search.DestinationStatus
	var d search.DestinationStatus
	var oldest *float64
	if _, err := pgx.ForEachRow(rows, []any{&d.Destination, &d.Lanes, &d.Queued, &d.Delivered, &d.Dead, &d.Cancelled, &oldest}, func() error {
		d.OldestQueuedSeconds = oldest
		wantD = append(wantD, d)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	if len(st.Destinations) != len(wantD) {
		e.t.Fatalf("after %s: status shows destinations %+v, tables say %+v", step, st.Destinations, wantD)
	}
	for i, g := range st.Destinations {
		w := wantD[i]
		if g.Destination != w.Destination || g.Lanes != w.Lanes || g.Queued != w.Queued || g.Delivered != w.Delivered ||
			g.Dead != w.Dead || g.Cancelled != w.Cancelled || !sameAge(g.OldestQueuedSeconds, w.OldestQueuedSeconds) {
			e.t.Fatalf("after %s: destination %+v, tables say %+v", step, g, w)
		}
	}
}

// sameAge: both absent, or both present and read moments apart.
func sameAge(a, b *float64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return math.Abs(*a-*b) < 5
}

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
		_, err := ops.ReplayDead(ctx, pool, pipeline.DeadFilter{Destination: "lab"}, ops.BulkOptions{BatchSize: 3})
		return err
	})
	loop("replay", func(rng *rand.Rand, _ int) error {
		var max int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM mefor_message").Scan(&max); err != nil || max == 0 {
			return err
		}
		_, err := ops.Replay(ctx, pool, 1+rng.Int64N(max))
		return err
	})
	loop("cancel", func(rng *rand.Rand, _ int) error {
		time.Sleep(20 * time.Millisecond)
		_, err := ops.Cancel(ctx, pool, pipeline.CancelFilter{Destination: "lab", Top: rng.IntN(4) != 0}, ops.BulkOptions{BatchSize: 2})
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
