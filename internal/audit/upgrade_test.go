package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A database made by the release before migration 019 keeps a chain that
// verifies: its rows were hashed by the client with the encoding the
// server now uses, and the first row the server appends chains on. The
// first signed anchor then covers the old rows too.
func TestChainOfTheReleaseBeforeVerifiesAfterTheUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := migrations.MigrateTo(ctx, db.Pool, nil, 18); err != nil {
		t.Fatal(err)
	}
	// The release's Append: the client draws seq, reads the head, hashes
	// and inserts, under the advisory lock, as the role it runs as.
	prev := ""
	for i := int64(1); i <= 3; i++ {
		r := audit.Record{Seq: i, At: time.Now().UTC().Truncate(time.Microsecond), OSUser: "ops", DBRole: "postgres",
			Host: "old-host", Node: map[bool]string{true: "node-a"}[i == 2], Action: audit.ActionReplay,
			Target: []byte(`{"message_ids":[` + strings.Repeat("7", int(i)) + `]}`), Outcome: audit.OutcomeOK, PrevHash: prev}
		r.Hash = audit.RowHash(r)
		fixtures.Exec(t, db, `SELECT pg_advisory_xact_lock(27969, 0)`)
		fixtures.Exec(t, db, `INSERT INTO mefor_audit (seq, at, os_user, db_role, host, node_id, action, target, outcome, prev_hash, hash)
			VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9, $10, $11)`,
			r.Seq, r.At, r.OSUser, r.DBRole, r.Host, r.Node, r.Action, string(r.Target), r.Outcome, r.PrevHash, r.Hash)
		prev = r.Hash
	}
	if v := verify(t, db, nil); !v.OK() || v.Rows != 3 {
		t.Fatalf("verify before the upgrade = %+v", v)
	}

	if _, err := migrations.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	withRoles(t, db)
	appendN(t, db, 2)
	v := verify(t, db, nil)
	if !v.OK() || v.Rows != 5 || len(v.Setup) != 0 || v.SetupNote != "" {
		t.Fatalf("verify after the upgrade = %+v; want the old and new rows in one chain, the log protected", v)
	}
	keys := newKeys(t, "a1")
	if _, took, err := audit.TakeAnchor(ctx, db.Pool, keys, "node-a"); err != nil || !took {
		t.Fatalf("TakeAnchor: %v, %v", took, err)
	}
	// A rewrite of an old row is now caught by the key.
	fixtures.Exec(t, db, `UPDATE mefor_audit SET os_user = 'someone-else' WHERE seq = 1`)
	v, err := audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: keys})
	if err != nil || v.OK() || v.BadSeq != 1 {
		t.Fatalf("verify of a rewritten old row = %+v, %v", v, err)
	}
}
