package drainer_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// A hand-off sent as one trip (no transaction block) is refused as a whole
// by the database when the execution is superseded (ErrSuperseded) or when
// a lane it writes has no live drainer (ErrNeedsTx): in neither case does
// anything of it commit. When it goes through, the lane's remaining rows
// come back from the same transaction, without the rows it consumed.
func TestTripHandoffs(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
	ctx := context.Background()

	var msg int64
	if err := db.Pool.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('c', 'test', 1, 'x', 'received')
		RETURNING id`).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	// Two rows in each upstream lane: the trip hands the first off and must
	// read the second back.
	exec(t, db, `
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination) VALUES
			($1, 'ingress', 'ingress:c', 'c', NULL, NULL, NULL),
			($1, 'ingress', 'ingress:c', 'c', NULL, NULL, NULL),
			($1, 'routed', 'routed:c', 'c', 'r', 'h', NULL),
			($1, 'routed', 'routed:c', 'c', 'r', 'h', NULL),
			($1, 'outbound', 'outbound:d', 'c', 'r', 'h', 'd'),
			($1, 'outbound', 'outbound:d', 'c', 'r', 'h', 'd')`, msg)
	id := queue(t, db, ins, "outbound:job")
	var at time.Time
	if err := db.Pool.QueryRow(ctx, `
		UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1
		RETURNING attempted_at`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	current := drainer.Execution{JobID: id, AttemptedAt: at}
	stale := drainer.Execution{JobID: id, AttemptedAt: at.Add(-time.Second)}
	activate := func(lane string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
				return err
			}
			return jobs.Activate(ctx, tx, ins, []string{lane})
		}); err != nil {
			t.Fatal(err)
		}
	}
	head := func(lane string) drainer.Row {
		t.Helper()
		rows, err := drainer.PendingRows(ctx, db.Pool, lane, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("pending row of %s: %v %v", lane, rows, err)
		}
		return rows[0]
	}
	snapshot := func() string {
		t.Helper()
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
	handoffs := []struct {
		name string
		lane string
		// writes is the lane the hand-off produces into ("" for none)
		writes string
		do     func(tr *drainer.Trip, ex drainer.Execution, r drainer.Row) error
	}{
		{"route", "ingress:c", "routed:c", func(tr *drainer.Trip, ex drainer.Execution, r drainer.Row) error {
			return drainer.RouteBatchTrip(ctx, tr, ex, []drainer.Row{r},
				[]drainer.RouteDecision{{Outs: []drainer.RoutedOut{{Route: "r", Handler: "h"}}}})
		}},
		{"transform", "routed:c", "outbound:d", func(tr *drainer.Trip, ex drainer.Execution, r drainer.Row) error {
			return drainer.TransformBatchTrip(ctx, tr, ex, []drainer.Row{r},
				[]drainer.TransformDecision{{Outs: []drainer.OutboundOut{{Destination: "d", Lane: "outbound:d", Payload: []byte("x")}}}})
		}},
		{"deliver", "outbound:d", "", func(tr *drainer.Trip, ex drainer.Execution, r drainer.Row) error {
			_, err := drainer.RecordAttemptsTrip(ctx, tr, ex, []drainer.Outcome{{Row: r, Delivered: true,
				Attempt: drainer.Attempt{Outcome: "delivered", AckCode: "AA"}}})
			return err
		}},
	}
	for _, h := range handoffs {
		trip := func() *drainer.Trip { return &drainer.Trip{DB: db.Pool, Lane: h.lane, Limit: 10} }
		before := snapshot()
		r := head(h.lane)

		tr := trip()
		if err := h.do(tr, stale, r); !errors.Is(err, drainer.ErrSuperseded) {
			t.Fatalf("%s by a superseded execution: %v, want ErrSuperseded", h.name, err)
		}
		if after := snapshot(); after != before || tr.Read {
			t.Fatalf("%s by a superseded execution changed the pipeline (or read the lane):\n before %s\n after  %s", h.name, before, after)
		}

		if h.writes != "" {
			tr = trip()
			if err := h.do(tr, current, r); !errors.Is(err, drainer.ErrNeedsTx) {
				t.Fatalf("%s into %s, which has no live drainer: %v, want ErrNeedsTx", h.name, h.writes, err)
			}
			if after := snapshot(); after != before {
				t.Fatalf("%s into a lane with no live drainer committed:\n before %s\n after  %s", h.name, before, after)
			}
			activate(h.writes)
		}

		tr = trip()
		if err := h.do(tr, current, r); err != nil {
			t.Fatalf("%s by the running execution: %v", h.name, err)
		}
		if after := snapshot(); after == before {
			t.Fatalf("%s by the running execution changed nothing", h.name)
		}
		pending, err := drainer.PendingRows(ctx, db.Pool, h.lane, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !tr.Read || len(pending) == 0 || !sameRows(tr.Next, pending) {
			t.Fatalf("%s read back %v (read %v), want the lane's pending rows %v", h.name, ids(tr.Next), tr.Read, ids(pending))
		}
	}
}

func ids(rows []drainer.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func sameRows(a, b []drainer.Row) bool { return slices.Equal(ids(a), ids(b)) }

// A trip told by its hint that a lane it writes has no live drainer is not
// sent at all: the caller goes straight to a transaction.
func TestTripHintSkipsTheTrip(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	var msg int64
	if err := db.Pool.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('c', 'test', 1, 'x', 'received')
		RETURNING id`).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	exec(t, db, `INSERT INTO mefor_work (message_id, stage, lane, channel) VALUES ($1, 'ingress', 'ingress:c', 'c')`, msg)
	rows, err := drainer.PendingRows(ctx, db.Pool, "ingress:c", 1)
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	var sent int
	tr := &drainer.Trip{DB: countingBatcher{db.Pool, &sent}, Lane: "ingress:c", Limit: 10,
		Live: func([]string) bool { return false }}
	err = drainer.RouteBatchTrip(ctx, tr, drainer.NoFence, rows,
		[]drainer.RouteDecision{{Outs: []drainer.RoutedOut{{Route: "r", Handler: "h"}}}})
	if !errors.Is(err, drainer.ErrNeedsTx) || sent != 0 {
		t.Fatalf("hinted-dead lane: %v after %d batch(es), want ErrNeedsTx before any", err, sent)
	}
}

type countingBatcher struct {
	drainer.Batcher
	n *int
}

func (c countingBatcher) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	*c.n++
	return c.Batcher.SendBatch(ctx, b)
}
