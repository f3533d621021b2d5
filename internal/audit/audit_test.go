package audit_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

func appendN(t *testing.T, db *testcontainers.DB, n int) {
	t.Helper()
	for i := range n {
		e := audit.Entry{Action: audit.ActionReplay, Target: map[string]any{"message_ids": []int64{int64(i + 1)}}}
		if err := audit.AppendAlone(context.Background(), db.Pool, e); err != nil {
			t.Fatal(err)
		}
	}
}

func verify(t *testing.T, db *testcontainers.DB, anchor *audit.Anchor) audit.Verification {
	t.Helper()
	v, err := audit.Verify(context.Background(), db.Pool, anchor)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// logOf is a database of the test's own whose audit log holds n entries.
func logOf(t *testing.T, n int) *testcontainers.DB {
	t.Helper()
	db := testcontainers.NewDB(t)
	appendN(t, db, n)
	return db
}

func TestRowsSayWhoDidWhat(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionStepdown, Node: "node-a",
		Target: map[string]any{"request_id": 7, "destination": "lab"}, Outcome: "released"})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := audit.List(ctx, db.Pool, audit.Filter{})
	if err != nil || len(recs) != 1 {
		t.Fatalf("List = %v, %v", recs, err)
	}
	r := recs[0]
	if r.Seq != 1 || r.DBRole != "postgres" || r.OSUser == "" || r.Host == "" || r.Node != "node-a" ||
		r.Action != audit.ActionStepdown || r.Outcome != "released" || r.PrevHash != "" || len(r.Hash) != 64 {
		t.Fatalf("record = %+v", r)
	}
	var target map[string]any
	if err := json.Unmarshal(r.Target, &target); err != nil || target["destination"] != "lab" {
		t.Fatalf("target = %s, %v", r.Target, err)
	}
	if v := verify(t, db, nil); !v.OK() || v.Rows != 1 {
		t.Fatalf("verify = %+v", v)
	}
}

func TestConcurrentWritersDoNotForkTheChain(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	const writers, each = 6, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					// Some work of the action first, as callers do.
					if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.002)"); err != nil {
						return err
					}
					return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionCancel,
						Target: map[string]any{"writer": w, "i": i}})
				})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("append: %v", err)
	}
	v := verify(t, db, nil)
	if !v.OK() || v.Rows != writers*each || v.Head.Seq != writers*each {
		t.Fatalf("verify = %+v; want %d rows in one chain", v, writers*each)
	}
}

func TestAlteredRowIsNamed(t *testing.T) {
	t.Parallel()
	db := logOf(t, 5)

	fixtures.Exec(t, db, `UPDATE mefor_audit SET target = '{"message_ids":[99]}' WHERE seq = 3`)
	v := verify(t, db, nil)
	if v.OK() || v.BadSeq != 3 || !strings.Contains(v.Problem, "row 3 was altered") {
		t.Fatalf("verify = %+v; want row 3 named altered", v)
	}

	// Altering the hash along with the contents moves the break to the
	// next row, which still names the previous hash.
	fixtures.Exec(t, db, `UPDATE mefor_audit SET os_user = 'someone-else', hash = repeat('a', 64) WHERE seq = 3`)
	v = verify(t, db, nil)
	if v.OK() || v.BadSeq != 3 {
		t.Fatalf("verify = %+v", v)
	}
}

func TestDeletedRowIsNamed(t *testing.T) {
	t.Parallel()
	db := logOf(t, 5)

	fixtures.Exec(t, db, `DELETE FROM mefor_audit WHERE seq = 2`)
	v := verify(t, db, nil)
	if v.OK() || v.BadSeq != 3 || !strings.Contains(v.Problem, "rows 2 to 2 were deleted") {
		t.Fatalf("verify = %+v; want row 3 named, after the deleted row 2", v)
	}

	// Renumbering to hide the gap breaks the chain instead.
	fixtures.Exec(t, db, `UPDATE mefor_audit SET seq = seq - 1 WHERE seq > 2`)
	v = verify(t, db, nil)
	if v.OK() || v.BadSeq != 2 {
		t.Fatalf("verify after renumbering = %+v", v)
	}

	db2 := logOf(t, 3)
	fixtures.Exec(t, db2, `DELETE FROM mefor_audit WHERE seq = 1`)
	if v := verify(t, db2, nil); v.OK() || v.BadSeq != 2 || !strings.Contains(v.Problem, "starts at row 2") {
		t.Fatalf("verify without the first row = %+v", v)
	}
}

func TestAnchorDetectsTruncation(t *testing.T) {
	t.Parallel()
	db := logOf(t, 5)
	ctx := context.Background()
	head, err := audit.Head(ctx, db.Pool)
	if err != nil || head.Seq != 5 {
		t.Fatalf("Head = %v, %v", head, err)
	}
	parsed, err := audit.ParseAnchor(head.String())
	if err != nil || parsed != head {
		t.Fatalf("ParseAnchor(%q) = %v, %v", head.String(), parsed, err)
	}

	// The log may grow past its anchor.
	appendN(t, db, 2)
	if v := verify(t, db, &head); !v.OK() || v.Rows != 7 {
		t.Fatalf("verify of a grown log = %+v", v)
	}

	// Cutting the tail leaves a valid chain; only the anchor sees it.
	fixtures.Exec(t, db, `DELETE FROM mefor_audit WHERE seq >= 4`)
	if v := verify(t, db, nil); !v.OK() {
		t.Fatalf("a cut chain should still verify alone: %+v", v)
	}
	v := verify(t, db, &head)
	if v.OK() || v.BadSeq != 5 || !strings.Contains(v.Problem, "rows 4 to 5 were deleted") {
		t.Fatalf("verify with the anchor = %+v; want rows 4 to 5 named deleted", v)
	}

	// A chain rebuilt from scratch is valid but is not the anchored one.
	fixtures.Exec(t, db, `DELETE FROM mefor_audit`)
	appendN(t, db, 6)
	if v := verify(t, db, &head); v.OK() || v.BadSeq != 5 || !strings.Contains(v.Problem, "rewritten") {
		t.Fatalf("verify of a rebuilt chain = %+v", v)
	}

	for _, bad := range []string{"", "5", "x:y", "5:abc", "0:" + head.Hash, "-1:"} {
		if _, err := audit.ParseAnchor(bad); err == nil {
			t.Errorf("ParseAnchor(%q) accepted", bad)
		}
	}
	if a, err := audit.ParseAnchor("0:"); err != nil || a.Seq != 0 {
		t.Errorf(`ParseAnchor("0:") = %v, %v`, a, err)
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	db := logOf(t, 2)
	ctx := context.Background()
	if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionReload}); err != nil {
		t.Fatal(err)
	}
	recs, err := audit.List(ctx, db.Pool, audit.Filter{Action: audit.ActionReload})
	if err != nil || len(recs) != 1 || recs[0].Seq != 3 {
		t.Fatalf("by action: %v, %v", recs, err)
	}
	recs, err = audit.List(ctx, db.Pool, audit.Filter{Since: recs[0].At})
	if err != nil || len(recs) != 1 {
		t.Fatalf("since: %v, %v", recs, err)
	}
	recs, err = audit.List(ctx, db.Pool, audit.Filter{Limit: 2})
	if err != nil || len(recs) != 2 || recs[0].Seq != 3 {
		t.Fatalf("newest first, limited: %v, %v", recs, err)
	}
}
