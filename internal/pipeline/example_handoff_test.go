package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// A drainer hands rows off under its Execution: the job id and the
// attempted_at River stamped when it fetched the job. The hand-off's batch
// starts with the fence, so an execution River has since rescued (and maybe
// started again elsewhere) changes nothing and gets ErrSuperseded.
func ExampleRouteBatch() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		panic(err)
	}
	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, db.Pool, fn) }

	// A listener stores a message; its ingress lane gets a drainer job.
	err = inTx(func(tx pgx.Tx) error {
		_, err := pipeline.Receive(ctx, tx, client, pipeline.Inbound{Channel: "adt", Source: "example",
			Raw: []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|C1|P|2.5\r"), ControlID: "C1", MessageType: "ADT"})
		return err
	})
	if err != nil {
		panic(err)
	}
	// River fetches the job: running, attempted_at stamped.
	lane := jobs.IngressLane("adt")
	var ex pipeline.Execution
	if err := db.Pool.QueryRow(ctx, `
		UPDATE river_job SET state = 'running', attempt = attempt + 1, attempted_at = now()
		WHERE kind = 'mefor_ingress' RETURNING id, attempted_at`).Scan(&ex.JobID, &ex.AttemptedAt); err != nil {
		panic(err)
	}

	rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 100)
	if err != nil {
		panic(err)
	}
	decisions := []pipeline.RouteDecision{{Outs: []pipeline.RoutedOut{{Route: "all", Handler: "passthrough"}}}}

	// An execution that is no longer the running one: refused, nothing changed.
	stale := pipeline.Execution{JobID: ex.JobID, AttemptedAt: ex.AttemptedAt.Add(-time.Second)}
	err = inTx(func(tx pgx.Tx) error { return pipeline.RouteBatch(ctx, tx, client, stale, rows, decisions) })
	fmt.Println("stale execution superseded:", errors.Is(err, pipeline.ErrSuperseded))

	// The running execution: the ingress row is consumed and the routed
	// row written in the same transaction.
	if err := inTx(func(tx pgx.Tx) error { return pipeline.RouteBatch(ctx, tx, client, ex, rows, decisions) }); err != nil {
		panic(err)
	}
	left, _ := pipeline.PendingRows(ctx, db.Pool, lane, 100)
	routed, _ := pipeline.PendingRows(ctx, db.Pool, jobs.RoutedLane("adt"), 100)
	fmt.Printf("ingress rows left: %d, routed rows: %d\n", len(left), len(routed))
	// Output:
	// stale execution superseded: true
	// ingress rows left: 0, routed rows: 1
}
