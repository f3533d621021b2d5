package jobs_test

import (
	"context"
	"errors"
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

// Writing to a lane in one round trip, outside a transaction block: the
// batch takes the lane's lock, checks that the lane has a live drainer,
// then writes. PostgreSQL runs such a batch as one implicit transaction, so
// when the check raises nothing the batch wrote is committed. The caller
// then writes again in a transaction that activates the lane, and the next
// one-trip batch passes.
func ExampleQueueLiveDrainerCheck() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		panic(err)
	}
	// A stand-in for the rows a producer writes to the lane.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE example_inbox (lane text, body text)`); err != nil {
		panic(err)
	}

	lane := jobs.IngressLane("adt")
	oneTrip := func() error {
		b := &pgx.Batch{}
		jobs.QueueLocks(b, []string{lane})
		jobs.QueueLiveDrainerCheck(b, []string{lane})
		b.Queue(`INSERT INTO example_inbox VALUES ($1, 'one trip')`, lane)
		return db.Pool.SendBatch(ctx, b).Close()
	}
	inbox := func() (n int) {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM example_inbox`).Scan(&n); err != nil {
			panic(err)
		}
		return n
	}

	err = oneTrip()
	fmt.Printf("no drainer yet: ErrNoLiveDrainer=%t, rows=%d\n", errors.Is(err, jobs.ErrNoLiveDrainer), inbox())

	// The fallback: the same write in a transaction that activates the lane.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO example_inbox VALUES ($1, 'activating')`, lane); err != nil {
			return err
		}
		return jobs.Activate(ctx, tx, client, []string{lane})
	})
	if err != nil {
		panic(err)
	}

	err = oneTrip()
	fmt.Printf("drainer live: err=%v, rows=%d\n", err, inbox())
	// Output:
	// no drainer yet: ErrNoLiveDrainer=true, rows=0
	// drainer live: err=<nil>, rows=2
}

// The batch form of Activate, for a producer that sends its lock, writes and
// check in one round trip inside its transaction: QueueActivation reads the
// lanes' drainers with the batch, and Finish, once the batch's results are
// closed, inserts a drainer only for the lanes that had none.
func ExampleQueueActivation() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		panic(err)
	}

	lanes := []string{jobs.RoutedLane("adt"), jobs.OutboundLane("lab", 0, 1, 0)}
	activate := func() {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			jobs.QueueLocks(b, lanes)
			// ... the producer's writes to the lanes go here ...
			act := jobs.QueueActivation(b, lanes)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			return act.Finish(ctx, tx, client)
		})
		if err != nil {
			panic(err)
		}
	}
	activate()
	activate()

	var drainers int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE args->>'lane' = ANY($1)`, lanes).Scan(&drainers); err != nil {
		panic(err)
	}
	fmt.Printf("%d lanes activated twice: %d drainers\n", len(lanes), drainers)
	// Output:
	// 2 lanes activated twice: 2 drainers
}
