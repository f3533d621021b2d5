package leader_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
)

// A node holds the listener lease while its renewals are confirmed. When
// they stop (the node froze, or lost the database), its gate closes on its
// own clock after FenceTimeout, well before the lease expires on the
// database clock and another node may take it. Run calls Tick every
// heartbeat; here the ticks are made by hand.
func ExampleLease() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()

	// NewLease refuses timings under which two nodes could serve at once.
	_, err := leader.NewLease(leader.LeaseConfig{Pool: db.Pool, NodeID: "node-a",
		Heartbeat: time.Second, FenceTimeout: 5 * time.Second, TTL: 3 * time.Second})
	fmt.Println(err)

	cfg := leader.LeaseConfig{Pool: db.Pool, Heartbeat: time.Second, FenceTimeout: 3 * time.Second, TTL: 10 * time.Second}
	cfg.NodeID = "node-a"
	a, err := leader.NewLease(cfg)
	if err != nil {
		panic(err)
	}
	cfg.NodeID = "node-b"
	b, err := leader.NewLease(cfg)
	if err != nil {
		panic(err)
	}

	a.Tick(ctx) // acquires the free lease
	b.Tick(ctx) // finds it held
	fmt.Println("a serving:", a.Serving(), "b serving:", b.Serving())

	// No renewal for longer than FenceTimeout: a stops serving, although
	// the lease row still names it and keeps b out until it expires.
	time.Sleep(a.FenceTimeout() + 100*time.Millisecond)
	b.Tick(ctx)
	holder, err := leader.LeaseHolder(ctx, db.Pool, leader.ListenerLeaseKey)
	if err != nil {
		panic(err)
	}
	fmt.Println("a serving:", a.Serving(), "b serving:", b.Serving(), "holder:", holder)

	a.Tick(ctx) // a confirmed renewal opens the gate again
	fmt.Println("a serving:", a.Serving())
	// Output:
	// lease: TTL (3s) must be longer than the fence timeout (5s), or another node may take the lease while the holder still serves
	// a serving: true b serving: false
	// a serving: false b serving: false holder: node-a
	// a serving: true
}

// A planned failover: StepDown closes the holder's gate before it writes
// anything, lets the listeners drain, then expires the lease, so a standby
// takes it at its next tick. The node that stepped down keeps running as a
// standby and does not claim the lease back for two heartbeats.
func ExampleLease_StepDown() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()

	var a *leader.Lease
	cfg := leader.LeaseConfig{Pool: db.Pool, Heartbeat: time.Second, FenceTimeout: 3 * time.Second, TTL: 10 * time.Second,
		Drain: func(context.Context) { fmt.Println("draining listeners; a serving:", a.Serving()) }}
	cfg.NodeID = "node-a"
	a, err := leader.NewLease(cfg)
	if err != nil {
		panic(err)
	}
	cfg.NodeID, cfg.Drain = "node-b", nil
	b, err := leader.NewLease(cfg)
	if err != nil {
		panic(err)
	}
	a.Tick(ctx)

	res := a.StepDown(ctx)
	fmt.Println("outcome:", res.Outcome, "was holder:", res.WasHolder, "released:", res.ReleasedAt != nil)

	b.Tick(ctx)
	a.Tick(ctx)
	holder, err := leader.LeaseHolder(ctx, db.Pool, leader.ListenerLeaseKey)
	if err != nil {
		panic(err)
	}
	fmt.Println("a serving:", a.Serving(), "b serving:", b.Serving(), "holder:", holder)

	// Asked again, a node that no longer holds the lease refuses.
	fmt.Println("again:", a.StepDown(ctx).Outcome)
	// Output:
	// draining listeners; a serving: false
	// outcome: released was holder: true released: true
	// a serving: false b serving: true holder: node-b
	// again: not-holder
}

// Intake checks the lease in the round trip that stores a message. The
// check raises in the database, so even a batch sent outside a transaction
// block writes nothing for a node that does not hold a live lease, and the
// sender is never acknowledged.
func ExampleQueueLeaseCheck() {
	ctx := context.Background()
	db, drop := testcontainers.ExampleDB()
	defer drop()
	// A stand-in for the rows intake stores.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE example_inbox (node text)`); err != nil {
		panic(err)
	}
	a, err := leader.NewLease(leader.LeaseConfig{Pool: db.Pool, NodeID: "node-a",
		Heartbeat: time.Second, FenceTimeout: 3 * time.Second, TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	a.Tick(ctx)

	store := func(node string) error {
		b := &pgx.Batch{}
		leader.QueueLeaseCheck(b, node)
		b.Queue(`INSERT INTO example_inbox VALUES ($1)`, node)
		return db.Pool.SendBatch(ctx, b).Close()
	}
	for _, node := range []string{"node-a", "node-b"} {
		err := store(node)
		fmt.Printf("%s: stored=%t lease lost=%t\n", node, err == nil, errors.Is(err, leader.ErrNotLeaseHolder))
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM example_inbox`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Println("rows stored:", rows)
	// Output:
	// node-a: stored=true lease lost=false
	// node-b: stored=false lease lost=true
	// rows stored: 1
}
