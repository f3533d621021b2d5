package audit_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// withRoles sets up mefor's roles on db as `mefor migrate` does.
func withRoles(t *testing.T, db *testcontainers.DB) {
	t.Helper()
	res, err := migrations.ApplyRoles(context.Background(), db.Pool, nil)
	if err != nil || res.AuditSkipped != "" {
		t.Fatalf("ApplyRoles: %+v, %v", res, err)
	}
}

// login creates a login role in role ("" for none) and returns its name and
// a pool logged in as it.
func login(t *testing.T, db *testcontainers.DB, role string) (string, *pgxpool.Pool) {
	t.Helper()
	name, dbURL := fixtures.Login(t, db, role)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return name, pool
}

func newKeys(t *testing.T, id string) *audit.Keys {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := audit.ParseKeys(id + "=" + base64.StdEncoding.EncodeToString(raw))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The weakest role cannot break the log: its direct writes (a huge seq
// that would stop every later append, a junk hash that would fail verify
// forever, an update, a delete) are refused, and its later actions, and
// everyone else's, still audit and verify.
func TestReaderCannotBreakTheLog(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	withRoles(t, db)
	ctx := context.Background()
	readerName, reader := login(t, db, migrations.RoleReader)
	_, admin := login(t, db, migrations.RoleAdmin)
	_, nobody := login(t, db, "")

	if err := audit.AppendAlone(ctx, reader, audit.Entry{Action: audit.ActionViewBody, Outcome: audit.OutcomeDenied}); err != nil {
		t.Fatalf("a reader's append: %v", err)
	}
	attacks := []string{
		`INSERT INTO mefor_audit (seq, at, os_user, db_role, host, action, target, outcome, prev_hash, hash)
		 VALUES (9223372036854775807, now(), 'x', current_user, 'h', 'replay', '{}', 'ok', '', repeat('0', 64))`,
		`INSERT INTO mefor_audit (seq, at, os_user, db_role, host, action, target, outcome, prev_hash, hash)
		 VALUES (2, now(), 'x', current_user, 'h', 'replay', '{}', 'ok', 'junk', 'junk')`,
		`UPDATE mefor_audit SET outcome = 'junk'`,
		`DELETE FROM mefor_audit`,
		`TRUNCATE mefor_audit`,
		`SELECT mefor_audit_anchor_add(1, 1, 'x', '', '', '', '')`,
		`LOCK TABLE mefor_audit IN SHARE ROW EXCLUSIVE MODE`,
	}
	for who, pool := range map[string]*pgxpool.Pool{"reader": reader, "admin": admin, "no role": nobody} {
		for _, sql := range attacks {
			if who == "admin" && strings.Contains(sql, "anchor_add") {
				continue // a node's: it refuses junk itself (below)
			}
			_, err := pool.Exec(ctx, "BEGIN; "+sql+"; COMMIT")
			if !migrations.IsPermissionDenied(err) {
				t.Errorf("%s: %s: %v; want permission denied", who, strings.Fields(sql)[0], err)
			}
			_, _ = pool.Exec(ctx, "ROLLBACK")
		}
	}
	if _, err := admin.Exec(ctx, `SELECT mefor_audit_anchor_add(1, 1, 'x', '', '', '', '')`); err == nil ||
		!strings.Contains(err.Error(), "not in the log") {
		t.Errorf("an anchor of a row that is not in the log: %v", err)
	}
	if err := audit.AppendAlone(ctx, nobody, audit.Entry{Action: audit.ActionReplay}); !migrations.IsPermissionDenied(err) {
		t.Errorf("a login without a mefor role appended: %v", err)
	}

	for _, pool := range []*pgxpool.Pool{reader, admin, reader} {
		if err := audit.AppendAlone(ctx, pool, audit.Entry{Action: audit.ActionReplay, Target: map[string]any{"message_ids": []int{1}}}); err != nil {
			t.Fatalf("append after the attacks: %v", err)
		}
	}
	v, err := audit.Verify(ctx, reader, nil)
	if err != nil || !v.OK() || v.Rows != 4 || v.Head.Seq != 4 || v.SetupNote != "" {
		t.Fatalf("verify = %+v, %v; want 4 rows, the setup checked and sound", v, err)
	}
	recs, err := audit.List(ctx, reader, audit.Filter{})
	if err != nil || recs[len(recs)-1].DBRole != readerName {
		t.Fatalf("the first row names %v, want the reader %s (%v)", recs, readerName, err)
	}
}

// A superuser without the audit key can make the unkeyed chain say
// anything, consistently; the signed anchors catch every such rewrite.
func TestSuperuserRewriteIsCaughtByTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys := newKeys(t, "a1")
	rechain := func(db *testcontainers.DB) {
		// What an attacker who knows the encoding but not the key does:
		// recompute every hash from the first row, and make the anchors
		// name the new hashes.
		recs, err := audit.List(ctx, db.Pool, audit.Filter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		prev := ""
		for i := len(recs) - 1; i >= 0; i-- {
			r := recs[i]
			r.PrevHash = prev
			r.Hash = audit.RowHash(r)
			fixtures.Exec(t, db, `UPDATE mefor_audit SET prev_hash = $2, hash = $3 WHERE seq = $1`, r.Seq, r.PrevHash, r.Hash)
			fixtures.Exec(t, db, `UPDATE mefor_audit_anchor SET audit_hash = $2 WHERE audit_seq = $1`, r.Seq, r.Hash)
			prev = r.Hash
		}
	}
	setup := func(t *testing.T) *testcontainers.DB {
		db := testcontainers.NewDB(t)
		withRoles(t, db)
		appendN(t, db, 5)
		if _, took, err := audit.TakeAnchor(ctx, db.Pool, keys, "node-a"); err != nil || !took {
			t.Fatalf("TakeAnchor: %v, %v", took, err)
		}
		appendN(t, db, 2)
		if _, took, err := audit.TakeAnchor(ctx, db.Pool, keys, "node-a"); err != nil || !took {
			t.Fatalf("TakeAnchor: %v, %v", took, err)
		}
		if v, err := audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: keys}); err != nil || !v.OK() || v.AnchorsSigned != 2 {
			t.Fatalf("verify before the attack = %+v, %v", v, err)
		}
		return db
	}
	cases := map[string]string{
		"rewrite": `UPDATE mefor_audit SET target = '{"message_ids":[99]}', os_user = 'someone-else' WHERE seq = 3`,
		"delete": `DELETE FROM mefor_audit WHERE seq = 2; UPDATE mefor_audit SET seq = seq - 1 WHERE seq > 2;
			UPDATE mefor_audit_anchor SET audit_seq = audit_seq - 1 WHERE audit_seq > 2`,
		"insert": `UPDATE mefor_audit SET seq = seq + 1000 WHERE seq >= 4; UPDATE mefor_audit SET seq = seq - 999 WHERE seq > 1000;
			UPDATE mefor_audit_anchor SET audit_seq = audit_seq + 1 WHERE audit_seq >= 4;
			INSERT INTO mefor_audit (seq, at, os_user, db_role, host, action, target, outcome, prev_hash, hash)
			VALUES (4, now(), 'x', 'mefor_admin', 'h', 'replay', '{}', 'ok', '', '')`,
	}
	for name, attack := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			fixtures.Exec(t, db, attack)
			rechain(db)
			if v := verify(t, db, nil); !v.OK() {
				t.Fatalf("the rechained log should verify without the key (that is the attack): %+v", v)
			}
			v, err := audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: keys})
			if err != nil || v.OK() || !strings.Contains(v.Problem, "anchor 1: its signature does not match") {
				t.Fatalf("keyed verify = %+v, %v; want anchor 1's signature named", v, err)
			}
			// The key is what catches it: another key does not vouch.
			v, err = audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: newKeys(t, "zz")})
			if err != nil || v.OK() || !strings.Contains(v.Problem, `audit key "a1"`) {
				t.Fatalf("verify with another key = %+v, %v", v, err)
			}
		})
	}
	t.Run("cut tail", func(t *testing.T) {
		t.Parallel()
		db := setup(t)
		fixtures.Exec(t, db, `DELETE FROM mefor_audit WHERE seq >= 6`)
		v := verify(t, db, nil) // no key: the stored anchor still names row 7
		if v.OK() || v.BadSeq != 7 || !strings.Contains(v.Problem, "rows 6 to 7 were deleted") {
			t.Fatalf("verify of a cut tail = %+v; want rows 6 to 7 named", v)
		}
	})
	t.Run("anchor removed", func(t *testing.T) {
		t.Parallel()
		db := setup(t)
		fixtures.Exec(t, db, `DELETE FROM mefor_audit_anchor WHERE no = 1`)
		v, err := audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: keys})
		if err != nil || v.OK() || !strings.Contains(v.Problem, "anchors 1 to 1 were deleted") {
			t.Fatalf("verify = %+v, %v", v, err)
		}
	})
}

// audit verify reports a change of who may write the log.
func TestVerifyReportsWritableLog(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	if v := verify(t, db, nil); !v.OK() || !strings.Contains(v.SetupNote, "never set up") {
		t.Fatalf("verify without roles = %+v", v)
	}
	withRoles(t, db)
	appendN(t, db, 1)
	if v := verify(t, db, nil); !v.OK() || len(v.Setup) != 0 {
		t.Fatalf("verify = %+v", v)
	}
	fixtures.Exec(t, db, `GRANT INSERT ON mefor_audit TO mefor_operator; ALTER FUNCTION mefor_audit_append(text, text, text, text, text, text) OWNER TO mefor_admin`)
	v := verify(t, db, nil)
	got := strings.Join(v.Setup, "; ")
	if v.OK() || !strings.Contains(got, "role mefor_operator may INSERT mefor_audit directly") ||
		!strings.Contains(got, "is owned by mefor_admin, not mefor_audit_writer") {
		t.Fatalf("verify = %+v; want the grant and the owner named", v)
	}
	// mefor migrate puts it back.
	withRoles(t, db)
	if v, err := audit.Verify(ctx, db.Pool, nil); err != nil || !v.OK() {
		t.Fatalf("verify after migrate = %+v, %v", v, err)
	}
}
