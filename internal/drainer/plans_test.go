package drainer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// The pipeline's statements are planned once per session, not at every
// execution: PostgreSQL would otherwise plan each anew (a custom plan),
// which cost the server more than running them (store.PipelineTx). Over
// one session, intake (first in a transaction that activates the lane,
// then in the one round trip), lane reads, route hand-offs and the empty
// check must show no custom plan at all, and with the settings removed
// the first five executions of each are custom.
func TestPipelineStatementsPlanOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	ins := inserter(t, db)
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	conn := c.Conn()

	const runs = 8
	for i := range runs {
		ctrl := fmt.Sprintf("C%d", i)
		_, err := store.ReceiveBatch(ctx, conn, ins, []store.Inbound{{Channel: "adt", Source: "test",
			Raw: []byte(strings.Replace(handoffBody, "|C1|", "|"+ctrl+"|", 1)), ControlID: ctrl, MessageType: "ADT", TriggerEvent: "A01"}})
		if err != nil {
			t.Fatalf("store message %d: %v", i, err)
		}
		rows, err := drainer.PendingRows(ctx, conn, jobs.IngressLane("adt"), 10)
		if err != nil || len(rows) != 1 || rows[0].ControlID != ctrl {
			t.Fatalf("read ingress lane after message %d: %+v, %v", i, rows, err)
		}
		err = pgx.BeginTxFunc(ctx, conn, store.PipelineTx, func(tx pgx.Tx) error {
			return drainer.RouteHandoff(ctx, tx, ins, rows[0], []drainer.RoutedOut{{Route: "r", Handler: "passthrough"}})
		})
		if err != nil {
			t.Fatalf("route message %d: %v", i, err)
		}
		var empty bool
		err = pgx.BeginTxFunc(ctx, conn, store.PipelineTx, func(tx pgx.Tx) error {
			empty, err = drainer.CompleteIfEmpty(ctx, tx, jobs.IngressLane("adt"))
			return err
		})
		if err != nil || !empty {
			t.Fatalf("ingress lane after routing message %d: empty %v, %v", i, empty, err)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'routed' AND status = 'pending'`); n != runs {
		t.Fatalf("%d routed rows pending, want %d", n, runs)
	}

	rows, err := conn.Query(ctx, `
		SELECT regexp_replace(statement, '\s+', ' ', 'g'), generic_plans, custom_plans
		FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'`)
	if err != nil {
		t.Fatal(err)
	}
	type plans struct {
		SQL             string
		Generic, Custom int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[plans])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"INSERT INTO mefor_message": false, "JOIN mefor_message m ON m.id = w.message_id": false,
		"UPDATE mefor_message m SET status = u.status": false, "ORDER BY seq LIMIT 1": false}
	for _, p := range got {
		if p.Custom > 0 {
			t.Errorf("planned for its values (%d custom plans, %d generic): %.150s", p.Custom, p.Generic, p.SQL)
		}
		for key := range want {
			if strings.Contains(p.SQL, key) && p.Generic > 0 {
				want[key] = true
			}
		}
	}
	for key, seen := range want {
		if !seen {
			t.Errorf("no statement with %q ran with a generic plan in this session", key)
		}
	}
}
