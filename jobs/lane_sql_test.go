package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The lane lock keys the operator's write functions compute in SQL
// (mefor_lane_key) are jobs.LaneLock's, for every kind of lane name and
// for bytes beyond ASCII.
func TestLaneKeysAgreeWithGo(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	for _, lane := range []string{"", "a", "ingress:adt", "routed:adt", "outbound:lab", "outbound:lab~2#3",
		"outbound:a.b_c-d#12", "ingress:zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "ingress:ümlaut"} {
		_, want := jobs.LaneLock(lane)
		if got := fixtures.Count(t, db.Pool, `SELECT mefor_lane_key($1)`, lane); got != int64(want) {
			t.Errorf("mefor_lane_key(%q) = %d, jobs.LaneLock says %d", lane, got, want)
		}
	}
}

// mefor_activate_lanes inserts drainers River recognizes as its own: River's
// unique insert of the same lane afterwards is skipped as a duplicate of the
// SQL one, and the SQL activation of a lane River inserted (not recorded in
// mefor_lane) finds River's job instead of adding a second; once a drainer
// finished, both insert a new one. Each insert is announced to River's
// producers at commit.
func TestSQLActivationIsRiversUniqueInsert(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	ins := fixtures.Inserter(t, db)
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
	activate := func(lanes ...string) {
		t.Helper()
		// River's client may announce its own inserts (a duplicate
		// too): those are not the ones looked for.
		for {
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := conn.Conn().WaitForNotification(wctx)
			cancel()
			if err != nil {
				break
			}
		}
		if _, err := db.Pool.Exec(ctx, `SELECT mefor_lock_lanes($1), mefor_activate_lanes($1)`, lanes); err != nil {
			t.Fatalf("activate %v in SQL: %v", lanes, err)
		}
	}
	riverInsert := func(lane string) (int64, bool) {
		t.Helper()
		args, err := jobs.ArgsFor(lane)
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			id   int64
			skip bool
		}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			r, err := ins.InsertTx(ctx, tx, args, nil)
			if err == nil {
				res.id, res.skip = r.Job.ID, r.UniqueSkippedAsDuplicate
			}
			return err
		}); err != nil {
			t.Fatalf("River inserts the drainer of %s: %v", lane, err)
		}
		return res.id, res.skip
	}
	jobsOf := func(lane string) int64 {
		t.Helper()
		return fixtures.Count(t, db.Pool, `SELECT count(*) FROM river_job WHERE args->>'lane' = $1`, lane)
	}
	announced := func(queue string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification for River's producers of %s (%v)", queue, err)
		}
		if want := `{"queue": "` + queue + `"}`; n.Payload != want {
			t.Fatalf("announced %q, want %q", n.Payload, want)
		}
	}

	// SQL first, River after: River's insert is the SQL one's duplicate.
	for lane, queue := range map[string]string{"ingress:adt": jobs.QueueIngress, "routed:adt": jobs.QueueRouted,
		"outbound:lab~2#3": jobs.QueueOutbound} {
		activate(lane)
		announced(queue)
		sqlJob := drainerOf(t, db, lane)
		var kind, q string
		var maxAttempts, priority int
		if err := db.Pool.QueryRow(ctx, `SELECT kind, queue, max_attempts, priority FROM river_job WHERE id = $1`, sqlJob.id).
			Scan(&kind, &q, &maxAttempts, &priority); err != nil {
			t.Fatal(err)
		}
		args, _ := jobs.ArgsFor(lane)
		opts := args.(river.JobArgsWithInsertOpts).InsertOpts()
		if kind != args.Kind() || q != opts.Queue || maxAttempts != opts.MaxAttempts || priority != 1 {
			t.Errorf("lane %s: SQL inserted a %s job in queue %s, max_attempts %d, priority %d; River's is %s in %s, %d, 1",
				lane, kind, q, maxAttempts, priority, args.Kind(), opts.Queue, opts.MaxAttempts)
		}
		id, skipped := riverInsert(lane)
		if !skipped || id != sqlJob.id {
			t.Errorf("lane %s: River's insert after the SQL one made job %d (skipped as duplicate: %v); want job %d skipped",
				lane, id, skipped, sqlJob.id)
		}
		if n := jobsOf(lane); n != 1 {
			t.Errorf("lane %s has %d drainer jobs, want 1", lane, n)
		}
	}

	// River first, SQL after: the SQL activation finds River's job.
	const lost = "outbound:lost"
	riverID, _ := riverInsert(lost)
	activate(lost)
	if n := jobsOf(lost); n != 1 {
		t.Errorf("SQL activation of a lane River had a live drainer for made %d jobs, want 1", n)
	}
	if got := drainerOf(t, db, lost); got.id != riverID {
		t.Errorf("mefor_lane records job %d for %s, want River's %d", got.id, lost, riverID)
	}

	// A drainer that finished no longer holds its lane, for either.
	first := drainerOf(t, db, "ingress:adt")
	fixtures.Exec(t, db, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, first.id)
	activate("ingress:adt")
	second := drainerOf(t, db, "ingress:adt")
	if second.id == first.id || second.state != "available" {
		t.Fatalf("lane whose drainer completed has drainer %+v, want a new available one", second)
	}
	if id, skipped := riverInsert("ingress:adt"); !skipped || id != second.id {
		t.Errorf("River's insert after the second SQL drainer made job %d (skipped: %v), want %d skipped", id, skipped, second.id)
	}

	// A name that is not a lane is refused, and nothing is inserted.
	before := countJobs(t, db)
	for _, bad := range []string{`ingress:a"b`, "elsewhere:x", "outbound:Lab", "ingress:"} {
		if _, err := db.Pool.Exec(ctx, `SELECT mefor_activate_lanes($1)`, []string{bad}); err == nil {
			t.Errorf("mefor_activate_lanes(%q) inserted a drainer", bad)
		}
	}
	if n := countJobs(t, db); n != before {
		t.Errorf("%d jobs after refused activations, want %d", n, before)
	}
}
