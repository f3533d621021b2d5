package jobs_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// activation is one way producers lock and activate lanes in their
// transaction: directly (LockLanes + Activate, as reclaim does), queued on
// the batch that carries their writes (QueueLocks + QueueActivation, as
// intake and the hand-offs do), or in SQL (mefor_lock_lanes and
// mefor_activate_lanes, as the operator's write functions of migration 024
// do, River not being callable from there).
type activation struct {
	name     string
	activate func(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, lanes []string) error
	lock     func(ctx context.Context, tx pgx.Tx, lanes []string) error
}

var activations = []activation{
	{
		name: "direct",
		activate: func(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, lanes []string) error {
			if err := jobs.LockLanes(ctx, tx, lanes); err != nil {
				return err
			}
			return jobs.Activate(ctx, tx, ins, lanes)
		},
		lock: jobs.LockLanes,
	},
	{
		name: "batched",
		activate: func(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, lanes []string) error {
			b := &pgx.Batch{}
			jobs.QueueLocks(b, lanes)
			act := jobs.QueueActivation(b, lanes)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			return act.Finish(ctx, tx, ins)
		},
		lock: func(ctx context.Context, tx pgx.Tx, lanes []string) error {
			b := &pgx.Batch{}
			jobs.QueueLocks(b, lanes)
			return tx.SendBatch(ctx, b).Close()
		},
	},
	{
		name: "sql",
		activate: func(ctx context.Context, tx pgx.Tx, _ jobs.Inserter, lanes []string) error {
			_, err := tx.Exec(ctx, `SELECT mefor_lock_lanes($1), mefor_activate_lanes($1)`, lanes)
			return err
		},
		lock: func(ctx context.Context, tx pgx.Tx, lanes []string) error {
			_, err := tx.Exec(ctx, `SELECT mefor_lock_lanes($1)`, lanes)
			return err
		},
	},
}

// run locks and activates lanes in a transaction of their own.
func (a activation) run(t *testing.T, db *testcontainers.DB, ins jobs.Inserter, lanes ...string) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return a.activate(ctx, tx, ins, lanes) }); err != nil {
		t.Fatalf("activate %v: %v", lanes, err)
	}
}

type drainer struct {
	id          int64
	state, xmin string
}

// drainerOf returns the job mefor_lane records for a lane.
func drainerOf(t *testing.T, db *testcontainers.DB, lane string) drainer {
	t.Helper()
	var d drainer
	err := db.Pool.QueryRow(context.Background(), `
		SELECT j.id, j.state::text, j.xmin::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = $1`, lane).Scan(&d.id, &d.state, &d.xmin)
	if err != nil {
		t.Fatalf("drainer of %s: %v", lane, err)
	}
	return d
}

func countJobs(t *testing.T, db *testcontainers.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// One drainer per lane; activating a lane whose drainer is live writes
// nothing to that drainer's river_job row; a lane whose drainer finished gets
// a new one.
func TestActivateKeepsOneDrainerPerLaneWithoutWritingIt(t *testing.T) {
	t.Parallel()
	for _, a := range activations {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			testActivate(t, a)
		})
	}
}

func testActivate(t *testing.T, act activation) {
	db := testcontainers.NewDB(t)
	ins := fixtures.Inserter(t, db)
	const a, b = "outbound:a", "routed:b"

	act.run(t, db, ins, a)
	first := drainerOf(t, db, a)
	if first.state != "available" {
		t.Fatalf("new drainer is %s, want available", first.state)
	}
	for range 20 {
		act.run(t, db, ins, a)
	}
	if got := drainerOf(t, db, a); got != first {
		t.Fatalf("activating a live lane 20 times changed its drainer %+v -> %+v", first, got)
	}
	if n := countJobs(t, db); n != 1 {
		t.Fatalf("%d jobs for one lane", n)
	}

	act.run(t, db, ins, a, b)
	if n := countJobs(t, db); n != 2 {
		t.Fatalf("%d jobs for two lanes, want 2", n)
	}
	var kind string
	if err := db.Pool.QueryRow(context.Background(), `SELECT kind FROM river_job WHERE id = $1`, drainerOf(t, db, b).id).Scan(&kind); err != nil || kind != "mefor_routed" {
		t.Fatalf("drainer of %s is a %q job (%v), want mefor_routed", b, kind, err)
	}

	if _, err := db.Pool.Exec(context.Background(),
		`UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, first.id); err != nil {
		t.Fatal(err)
	}
	act.run(t, db, ins, a)
	if got := drainerOf(t, db, a); got.id == first.id || got.state != "available" {
		t.Fatalf("lane whose drainer completed has drainer %+v, want a new available one", got)
	}
}

// waitingForLock reports whether some backend waits for a lock.
func waitingForLock(t *testing.T, db *testcontainers.DB) bool {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A lane's lock is held until the transaction ends and excludes every other
// transaction writing that lane, but not transactions on other lanes.
//
// Producers lock lanes on their batch while drainers and reclaim lock them
// directly, so each way must exclude the other too.
func TestLockLanesExcludesWritersOfTheSameLane(t *testing.T) {
	t.Parallel()
	for _, holder := range activations {
		for _, waiter := range activations {
			t.Run(holder.name+"/"+waiter.name, func(t *testing.T) {
				t.Parallel()
				testLockLanes(t, holder.lock, waiter.lock)
			})
		}
	}
}

func testLockLanes(t *testing.T, hold, lock func(ctx context.Context, tx pgx.Tx, lanes []string) error) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()

	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if err := hold(ctx, holder, []string{"ingress:x", "outbound:y"}); err != nil {
		t.Fatal(err)
	}

	// Another lane: not blocked.
	other := make(chan error, 1)
	go func() {
		other <- pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return lock(ctx, tx, []string{"ingress:z"}) })
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("locking an unrelated lane blocked")
	}

	// The same lane: blocked until the holder commits.
	same := make(chan error, 1)
	go func() {
		same <- pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return lock(ctx, tx, []string{"outbound:y"}) })
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !waitingForLock(t, db) {
		select {
		case err := <-same:
			t.Fatalf("a second writer locked a lane another transaction holds (err %v)", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("second writer neither blocked nor returned")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-same:
		t.Fatalf("second writer returned (%v) while the lane was held", err)
	default:
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-same:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second writer still blocked after the holder committed")
	}
}

// Every activation that inserts a drainer announces it to River's
// producers at its commit, even when River's client skips its own
// notification because it notified the same queue a moment before: here
// the client's notification limit is a minute, so River announces only the
// first of two activations in separate transactions.
func TestActivationsAreAnnounced(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	ins, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{FetchCooldown: time.Minute, FetchPollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var channel string
	if err := conn.QueryRow(ctx, `SELECT current_schema() || '.river_insert'`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	for _, lane := range []string{"outbound:a", "outbound:b"} {
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
				return err
			}
			return jobs.Activate(ctx, tx, ins, []string{lane})
		}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("activating %s: no notification for River's producers (%v)", lane, err)
		}
		if want := `{"queue": "` + jobs.QueueOutbound + `"}`; n.Payload != want {
			t.Fatalf("activating %s announced %q, want %q", lane, n.Payload, want)
		}
		// River's own notification of the first may come as well.
		for {
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := conn.Conn().WaitForNotification(wctx)
			cancel()
			if err != nil {
				break
			}
		}
	}
	// A lane whose drainer is live inserts nothing and announces nothing.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := jobs.LockLanes(ctx, tx, []string{"outbound:a"}); err != nil {
			return err
		}
		return jobs.Activate(ctx, tx, ins, []string{"outbound:a"})
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(wctx); err == nil {
		t.Fatalf("activating a lane with a live drainer announced %q", n.Payload)
	}
}

// Activating many lanes at once (a node's first burst of traffic, every
// lane of a stage gone quiet) records each lane's own drainer, of its
// stage's kind, and costs the same few round trips as activating one: intake
// commits wait in line behind the one that activates, so a cost per lane
// was a wait for every sender at that moment. A lane whose drainer is
// already live, or live in River but not recorded in mefor_lane, keeps it.
func TestActivatingManyLanesRecordsEachDrainerInFewRoundTrips(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	trips := &testcontainers.RoundTrips{}
	pool := db.TracedPool(t, trips)
	ins, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	activate := func(lanes []string) int64 {
		t.Helper()
		var n int64
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := jobs.LockLanes(ctx, tx, lanes); err != nil {
				return err
			}
			before := trips.N.Load()
			err := jobs.Activate(ctx, tx, ins, lanes)
			n = trips.N.Load() - before
			return err
		}); err != nil {
			t.Fatalf("activate %d lanes: %v", len(lanes), err)
		}
		return n
	}

	one := activate([]string{"ingress:solo"})
	// A live drainer already recorded, and one River has but mefor_lane
	// lost (the unique key finds it): neither gets a second job.
	live := drainerOf(t, db, "ingress:solo")
	lost, err := ins.Insert(ctx, jobs.OutboundArgs{Lane: "outbound:lost"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lanes []string
	for i := range 12 {
		lanes = append(lanes, fmt.Sprintf("ingress:c%02d", i), fmt.Sprintf("routed:c%02d", i), fmt.Sprintf("outbound:d%02d", i))
	}
	lanes = append(lanes, "ingress:solo", "outbound:lost")
	slices.Sort(lanes)
	many := activate(lanes)
	if many > one {
		t.Errorf("activating %d lanes took %d round trips, one lane %d: the cost grows with the lanes", len(lanes), many, one)
	}

	kinds := map[string]string{"ingress": "mefor_ingress", "routed": "mefor_routed", "outbound": "mefor_outbound"}
	seen := map[int64]string{}
	for _, lane := range lanes {
		var id int64
		var kind, argLane, state string
		if err := db.Pool.QueryRow(ctx, `
			SELECT j.id, j.kind, j.args->>'lane', j.state::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
			WHERE l.name = $1`, lane).Scan(&id, &kind, &argLane, &state); err != nil {
			t.Fatalf("drainer of %s: %v", lane, err)
		}
		stage, _, _ := strings.Cut(lane, ":")
		if argLane != lane || kind != kinds[stage] || state != "available" {
			t.Errorf("lane %s records job %d: a %s %s job for lane %q", lane, id, state, kind, argLane)
		}
		if other, ok := seen[id]; ok {
			t.Errorf("lanes %s and %s record the same job %d", other, lane, id)
		}
		seen[id] = lane
	}
	if got := drainerOf(t, db, "ingress:solo"); got != live {
		t.Errorf("the live drainer of ingress:solo changed %+v -> %+v", live, got)
	}
	if got := drainerOf(t, db, "outbound:lost"); got.id != lost.Job.ID {
		t.Errorf("outbound:lost records job %d, want River's live job %d", got.id, lost.Job.ID)
	}
	if n := countJobs(t, db); n != len(lanes) {
		t.Errorf("%d jobs for %d lanes", n, len(lanes))
	}
}
