package pipeline_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// operatorLogin applies mefor's roles to db and returns a pool logged in
// as a new operator.
func operatorLogin(t *testing.T, db *testcontainers.DB) *pgxpool.Pool {
	t.Helper()
	if _, err := migrations.ApplyRoles(context.Background(), db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	_, pool := fixtures.LoginPool(t, db, migrations.RoleOperator)
	return pool
}

// An operator's replay of a message whose lane has a live drainer leaves
// that drainer as it is, unwritten, and adds none; a lane whose drainer
// finished gets exactly one. Enqueues into a live ingress lane add none
// either.
func TestOperatorWritesKeepOneDrainerPerLane(t *testing.T) {
	ctx, db, ins := laneTest(t)
	op := operatorLogin(t, db)
	const lane = "outbound:lab"
	job := fixtures.Queue(t, db, ins, lane)
	liveJob := func() (int64, string) {
		t.Helper()
		var id int64
		var xmin string
		if err := db.Pool.QueryRow(ctx, `
			SELECT j.id, j.xmin::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id WHERE l.name = $1`, lane).
			Scan(&id, &xmin); err != nil {
			t.Fatal(err)
		}
		return id, xmin
	}
	drainers := func(lane string) int64 {
		return fixtures.Count(t, db.Pool, `SELECT count(*) FROM river_job WHERE args->>'lane' = $1`, lane)
	}
	dead := func() int64 {
		t.Helper()
		var msg int64
		if err := db.Pool.QueryRow(ctx, `
			UPDATE mefor_work SET status = 'dead', finished_at = now() WHERE lane = $1 AND status = 'pending'
			RETURNING message_id`, lane).Scan(&msg); err != nil {
			t.Fatal(err)
		}
		return msg
	}
	replay := func(msg int64) {
		t.Helper()
		var res pipeline.ReplayResult
		if err := pgx.BeginFunc(ctx, op, func(tx pgx.Tx) error {
			var err error
			res, err = pipeline.ReplayMessage(ctx, tx, pipeline.Audit{}, msg)
			return err
		}); err != nil || res.Rows != 1 {
			t.Fatalf("operator replays message %d: %+v, %v", msg, res, err)
		}
	}

	_, xmin := liveJob()
	replay(dead())
	if id, x := liveJob(); id != job || x != xmin || drainers(lane) != 1 {
		t.Errorf("replay into a lane with a live drainer: lane's job %d (xmin %s -> %s), %d jobs; want job %d untouched, alone",
			id, xmin, x, drainers(lane), job)
	}

	fixtures.Exec(t, db, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, job)
	replay(dead())
	if id, _ := liveJob(); id == job || drainers(lane) != 2 {
		t.Errorf("replay into a lane whose drainer completed: lane's job %d, %d jobs in all; want a new one beside the old",
			id, drainers(lane))
	}

	for range 3 {
		if err := pgx.BeginFunc(ctx, op, func(tx pgx.Tx) error {
			in, _, _ := pipeline.ParseInbound("adt", "enqueue", "", []byte(handoffBody))
			_, err := pipeline.Enqueue(ctx, tx, pipeline.Audit{}, in)
			return err
		}); err != nil {
			t.Fatalf("operator enqueues: %v", err)
		}
	}
	if n := drainers("ingress:adt"); n != 1 {
		t.Errorf("three enqueues made %d drainers of ingress:adt, want 1", n)
	}
}

// An operator's enqueue with keys stores the body sealed for the id the
// database drew, so it opens there; a sealed body copied from another
// message and enqueued by hand (the operator may read it through
// mefor_read_body) is stored under a fresh id, where it does not open.
func TestEnqueuedContentIsBoundToTheDrawnID(t *testing.T) {
	ctx, db, _ := laneTest(t)
	op := operatorLogin(t, db)
	kr := fixtures.Keyring(t, "k1")

	var first int64
	if err := pgx.BeginFunc(ctx, op, func(tx pgx.Tx) error {
		in, _, _ := pipeline.ParseInbound("adt", "enqueue", "", []byte(handoffBody))
		in.Keys = kr
		var err error
		first, err = pipeline.Enqueue(ctx, tx, pipeline.Audit{}, in)
		return err
	}); err != nil {
		t.Fatalf("operator enqueues: %v", err)
	}
	raw := func(id int64) []byte {
		t.Helper()
		var b []byte
		if err := db.Pool.QueryRow(ctx, `SELECT raw FROM mefor_message WHERE id = $1`, id).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	sealed := raw(first)
	if plain, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(first), sealed); err != nil || !bytes.Equal(plain, []byte(handoffBody)) {
		t.Fatalf("the enqueued body does not open for its message %d: %v", first, err)
	}

	var copied int64
	if err := pgx.BeginFunc(ctx, op, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `SELECT mefor_enqueue_id()`).Scan(&id); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT mefor_enqueue($1, 'adt', '', '', '', '', '', $2, $3, '', NULL, 'u', 'h', '{}')`,
			id, len(handoffBody), sealed).Scan(&copied)
	}); err != nil {
		t.Fatalf("operator enqueues a copied body: %v", err)
	}
	if copied == first {
		t.Fatalf("the copy was stored under the original's id %d", first)
	}
	if _, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(copied), raw(copied)); err == nil {
		t.Errorf("a body sealed for message %d opens as message %d's", first, copied)
	}
}
