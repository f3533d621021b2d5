package drainer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// Hand-offs of several drainers sent together (RunHandoffs) commit in one
// transaction or not at all: with every execution running, two channels'
// routing and a third's transform are all consumed and produced, each row
// in its own channel's lane, by one transaction; with one execution
// superseded nothing of any of them is written; begun with a lock timeout
// (store.PipelineTxLockTimeout, as the workers begin them), a lane whose
// lock is held elsewhere fails the shared transaction instead of holding
// everyone's hand-offs, and writes nothing; a hand-off with transform state
// is refused a shared transaction.
func TestSharedHandoffsCommitTogetherOrNotAtAll(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
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
	exec(t, db, `
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler) VALUES
			($1, 'ingress', 'ingress:c1', 'c1', NULL, NULL),
			($2, 'ingress', 'ingress:c2', 'c2', NULL, NULL),
			($3, 'routed', 'routed:c3', 'c3', 'r', 'h')`, m1, m2, m3)
	running := func(lane string) drainer.Execution { return start(t, db, queue(t, db, ins, lane)) }
	ex1, ex2, ex3 := running("outbound:job1"), running("outbound:job2"), running("outbound:job3")
	row := func(lane string) []drainer.Row {
		rows, err := drainer.PendingRows(ctx, db.Pool, lane, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("pending row of %s: %v %v", lane, rows, err)
		}
		return rows
	}
	r1, r2, r3 := row("ingress:c1"), row("ingress:c2"), row("routed:c3")
	routed := []drainer.RouteDecision{{Outs: []drainer.RoutedOut{{Route: "r", Handler: "h"}}}}
	handoffs := func(ex1, ex2, ex3 drainer.Execution) []*drainer.Handoff {
		return []*drainer.Handoff{
			drainer.PrepareRoute(ex1, r1, routed),
			drainer.PrepareRoute(ex2, r2, routed),
			drainer.PrepareTransform(ex3, r3, []drainer.TransformDecision{{
				Outs: []drainer.OutboundOut{{Destination: "d", Lane: "outbound:d", Payload: []byte("x")}}}}),
		}
	}
	bounded := store.PipelineTxLockTimeout(100 * time.Millisecond)
	run := func(ctx context.Context, hs []*drainer.Handoff) error {
		return pgx.BeginTxFunc(ctx, db.Pool, bounded, func(tx pgx.Tx) error { return drainer.RunHandoffs(ctx, tx, ins, hs...) })
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
	if err := run(ctx, handoffs(ex1, stale, ex3)); !errors.Is(err, drainer.ErrSuperseded) {
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

	withState := drainer.PrepareTransform(ex3, r3, []drainer.TransformDecision{{
		State: &state.Change{Writes: []state.Write{{Key: state.Key{Namespace: "n", Key: "k"}, Value: []byte(`1`)}}}}})
	if err := run(ctx, []*drainer.Handoff{drainer.PrepareRoute(ex1, r1, routed), withState}); err == nil {
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
