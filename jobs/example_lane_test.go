package jobs_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// Putting work into a lane: in the producer's transaction, lock the lane
// first (the row's seq is drawn under the lock, so seq order is commit
// order), write the row, then activate the lane. Activation inserts the
// lane's drainer job only when the lane has no live one; a second producer
// finds the first one's drainer and writes nothing to River.
func ExampleActivate() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()
	// An insert-only client (no queues, no workers) is enough to activate.
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		panic(err)
	}

	lane := jobs.OutboundLane("lab", 0, 1, 0)
	produce := func() {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `
				WITH m AS (
					INSERT INTO mefor_message (channel, source, size, raw, status)
					VALUES ('adt', 'example', 3, 'MSH', 'routed') RETURNING id)
				INSERT INTO mefor_work (message_id, stage, lane, channel, destination)
				SELECT id, 'outbound', $1, 'adt', 'lab' FROM m`, lane)
			if err != nil {
				return err
			}
			return jobs.Activate(ctx, tx, client, []string{lane})
		})
		if err != nil {
			panic(err)
		}
	}
	produce()
	produce()

	var rows, drainers int
	if err := db.Pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM mefor_work WHERE lane = $1),
			(SELECT count(*) FROM river_job WHERE kind = 'mefor_outbound' AND args->>'lane' = $1)`, lane).Scan(&rows, &drainers); err != nil {
		panic(err)
	}
	fmt.Printf("lane %s: %d rows, %d drainer\n", lane, rows, drainers)
	// Output:
	// lane outbound:lab: 2 rows, 1 drainer
}
