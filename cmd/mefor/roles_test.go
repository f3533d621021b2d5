package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// newLogin creates a login role that is a member of role (none: of no
// role) and returns its name and a database URL that logs in as it
// (fixtures.Login).
func newLogin(t *testing.T, db *testcontainers.DB, role string) (string, string) {
	t.Helper()
	return fixtures.Login(t, db, role)
}

// as runs the CLI with dbURL.
func as(t *testing.T, dbURL string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append(args, "--database-url", dbURL), &out, &errb)
	return code, out.String(), errb.String()
}

// The roles mefor migrate sets up allow each command to the roles
// docs/security.md gives it, and refuse it to the others with one line naming the role
// needed.
func TestRolesAllowAndRefuseCommands(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	f.ok(t, "migrate")
	f.ok(t, "migrate") // again: nothing to change, no error

	_, reader := newLogin(t, f.db, migrations.RoleReader)
	_, operator := newLogin(t, f.db, migrations.RoleOperator)
	adminName, admin := newLogin(t, f.db, migrations.RoleAdmin)
	nobodyName, nobody := newLogin(t, f.db, "")

	file := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(file, []byte(reloadConfigYAML(unusedAddr(t), unusedAddr(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	id := func(n int64) string { return strconv.FormatInt(n, 10) }
	allowed := func(url, who string, args ...string) string {
		t.Helper()
		code, out, errs := as(t, url, args...)
		if code != 0 {
			t.Errorf("%s: mefor %s: exit %d, want allowed\n%s%s", who, strings.Join(args, " "), code, out, errs)
		}
		return out
	}
	refused := func(url, who, needs string, args ...string) {
		t.Helper()
		code, out, errs := as(t, url, args...)
		var lines []string // what mefor says (River may log too)
		for _, l := range strings.Split(errs, "\n") {
			if strings.HasPrefix(l, "mefor:") {
				lines = append(lines, l)
			}
		}
		if code == 0 || len(lines) != 1 || !strings.Contains(errs, "needs the "+needs+" role") ||
			!strings.Contains(errs, "GRANT "+needs) {
			t.Errorf("%s: mefor %s: exit %d, want one line saying it needs %s\nstdout: %s\nstderr: %s",
				who, strings.Join(args, " "), code, needs, out, errs)
		}
	}

	reads := [][]string{
		{"status"}, {"messages", "list"}, {"messages", "show", id(f.dead)}, {"dead", "list"}, {"nodes"},
		{"audit", "list"}, {"audit", "verify"}, {"audit", "anchor"}, {"migrate", "--status"},
		{"maintenance", "list", "--config", file}, {"reference", "list", "--config", file},
	}
	for _, r := range reads {
		allowed(reader, "reader", r...)
	}
	refused(nobody, "no role", migrations.RoleReader, "status")
	refused(nobody, "no role", migrations.RoleReader, "messages", "list")

	refused(reader, "reader", migrations.RoleOperator, "messages", "list", "--patient", "SECRET-PATIENT")
	// A reader sees the dead letter's metadata, never its error text.
	if out := allowed(reader, "reader", "messages", "show", id(f.dead)); strings.Contains(out, "partner rejected") {
		t.Errorf("the reader's messages show has the error text:\n%s", out)
	}
	if out := allowed(reader, "reader", "dead", "list"); strings.Contains(out, "partner rejected") {
		t.Errorf("the reader's dead list has the error text:\n%s", out)
	}
	if out := allowed(operator, "operator", "dead", "list"); !strings.Contains(out, "partner rejected") {
		t.Errorf("the operator's dead list lacks the error text:\n%s", out)
	}
	refused(reader, "reader", migrations.RoleOperator, "messages", "show", id(f.done), "--body")
	refused(reader, "reader", migrations.RoleOperator, "messages", "list", "--text", "SECRET")
	refused(reader, "reader", migrations.RoleOperator, "replay", id(f.dead))
	refused(reader, "reader", migrations.RoleOperator, "replay-dead", "--yes")
	refused(reader, "reader", migrations.RoleOperator, "cancel", "--destination", "lab", "--wait", "0")
	refused(reader, "reader", migrations.RoleAdmin, "reload", "--config", file, "--timeout", "1s")

	out := allowed(operator, "operator", "messages", "show", id(f.done), "--body")
	if !strings.Contains(out, "SECRET-PATIENT") {
		t.Errorf("operator's show --body has no body:\n%s", out)
	}
	allowed(operator, "operator", "messages", "list", "--text", "SECRET")
	allowed(operator, "operator", "replay", id(f.dead))
	allowed(operator, "operator", "replay-dead", "--yes")
	allowed(operator, "operator", "cancel", "--destination", "lab", "--wait", "0")
	refused(operator, "operator", migrations.RoleAdmin, "reload", "--config", file, "--timeout", "1s")
	refused(operator, "operator", migrations.RoleAdmin, "maintenance", "run", "reclaim", "--config", file)
	refused(operator, "operator", migrations.RoleAdmin, "migrate")
	key := newKeySpec(t, "k1")
	if code, out, errs := cli(t, operator, key, "keys", "rotate"); code == 0 || !strings.Contains(errs, "needs the mefor_admin role") {
		t.Errorf("operator: keys rotate: exit %d, want refused naming mefor_admin\n%s%s", code, out, errs)
	}
	if code, out, errs := cli(t, operator, key, "keys", "status"); code != 0 {
		t.Errorf("operator: keys status: exit %d\n%s%s", code, out, errs)
	}

	allowed(admin, "admin", "reload", "--config", file, "--timeout", "1s")
	allowed(admin, "admin", "maintenance", "run", "reclaim", "--config", file)
	code, out, errs := as(t, admin, "migrate")
	if code != 0 || strings.Contains(errs, "warning") {
		t.Errorf("admin: migrate: exit %d\n%s%s", code, out, errs)
	}
	allowed(admin, "admin", "messages", "show", id(f.done), "--body")
	if code, out, errs := cli(t, admin, key, "keys", "rotate"); code != 0 || !strings.Contains(out, "re-encrypted") {
		t.Errorf("admin: keys rotate: exit %d\n%s%s", code, out, errs)
	}

	// The audit log says who did what, by database role; refused attempts
	// that reached the database are recorded as denied.
	recs := f.auditRows(t, "--limit", "1000")
	byRole := map[string][]string{}
	for _, r := range recs {
		byRole[r.DBRole] = append(byRole[r.DBRole], r.Action+"/"+r.Outcome)
	}
	if got := strings.Join(byRole[adminName], ","); !strings.Contains(got, "reload/requested") ||
		!strings.Contains(got, "maintenance-run/requested") || !strings.Contains(got, "view-body/ok") {
		t.Errorf("admin's audit rows: %s", got)
	}
	if len(byRole[nobodyName]) != 0 {
		t.Errorf("a role without privileges wrote audit rows: %v", byRole[nobodyName])
	}
	if v := f.ok(t, "audit", "verify"); !strings.Contains(v, "verified") {
		t.Errorf("audit verify: %s", v)
	}
}

// A node runs as a login role granted mefor_admin: it receives, routes and
// delivers.
func TestNodeRunsAsAdmin(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	if code, out, errs := as(t, db.URL, "migrate"); code != 0 {
		t.Fatalf("migrate: %d %s %s", code, out, errs)
	}
	_, admin := newLogin(t, db, migrations.RoleAdmin)
	file, _, dir := archiveConfig(t)
	pool, err := pgxpool.New(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	adminDB := &testcontainers.DB{Name: db.Name, URL: admin, Server: db.Server, Pool: pool}
	inProcessNode(t, adminDB, "node-admin", file)

	msg := filepath.Join(t.TempDir(), "adt.hl7")
	if err := os.WriteFile(msg, []byte(strings.Replace(fixtureBody, "%d", "1", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := as(t, admin, "enqueue", "--channel", "adt", msg); code != 0 {
		t.Fatalf("enqueue as admin: %d %s %s", code, out, errs)
	}
	cluster.Poll(t, 30*time.Second, "the message delivered to the file destination", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 1
	})
}

// mefor migrate run by the database's owner, a role that is not a
// superuser: with CREATEROLE it sets up everything and hands the tables to
// mefor_admin; without it (the roles already exist) the grants still
// apply, and it warns that admins cannot migrate.
func TestMigrateAsNonSuperuserOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, createRole := range []bool{true, false} {
		db := testcontainers.NewDB(t, testcontainers.Empty())
		owner, ownerURL := newLogin(t, db, "")
		if createRole {
			if _, err := db.Pool.Exec(ctx, "ALTER ROLE "+owner+" CREATEROLE"); err != nil {
				t.Fatal(err)
			}
		} else if code, out, errs := as(t, db.URL, "migrate"); code != 0 { // roles exist, as on a shared server
			t.Fatalf("migrate as superuser: %d %s %s", code, out, errs)
		} else if _, err := db.Pool.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+db.Name+" OWNER TO "+owner); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, "ALTER SCHEMA public OWNER TO "+owner); err != nil {
			t.Fatal(err)
		}
		code, out, errs := as(t, ownerURL, "migrate")
		if code != 0 {
			t.Fatalf("CREATEROLE %v: migrate as the owner: exit %d\n%s%s", createRole, code, out, errs)
		}
		var tableOwner string
		if err := db.Pool.QueryRow(ctx, `SELECT tableowner FROM pg_tables WHERE tablename = 'mefor_message'`).Scan(&tableOwner); err != nil {
			t.Fatal(err)
		}
		if createRole {
			// The owner closes its database; only a superuser can close
			// PostgreSQL's lock functions, and migrate says what to run.
			if tableOwner != migrations.RoleAdmin || !onlyLockWarning(errs) ||
				!strings.Contains(out, "revoked CONNECT and TEMP on this database from PUBLIC") {
				t.Errorf("with CREATEROLE: mefor_message owned by %s, stdout %q, stderr %q; want mefor_admin, the database closed, only the lock warning",
					tableOwner, out, errs)
			}
			_, admin := newLogin(t, db, migrations.RoleAdmin)
			if code, out, errs := as(t, admin, "migrate"); code != 0 || !onlyLockWarning(errs) {
				t.Errorf("admin after the owner's migrate: exit %d %s %s", code, out, errs)
			}
		} else if tableOwner != owner || !strings.Contains(errs, "warning: mefor_admin does not own") {
			t.Errorf("without CREATEROLE: mefor_message owned by %s, stderr %q; want %s and a warning", tableOwner, errs, owner)
		}
		_, reader := newLogin(t, db, migrations.RoleReader)
		if code, out, errs := as(t, reader, "status"); code != 0 {
			t.Errorf("CREATEROLE %v: reader's status: exit %d %s %s", createRole, code, out, errs)
		}
	}
}

// onlyLockWarning says stderr warns once, that the advisory lock functions
// are open, with the statement a superuser must run.
func onlyLockWarning(stderr string) bool {
	return strings.Count(stderr, "warning") == 1 &&
		strings.Contains(stderr, "warning: any login that can connect may take mefor's lane locks") &&
		strings.Contains(stderr, "as a superuser run: REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_lock(integer,integer) FROM PUBLIC")
}

// archiveConfig writes a config with one MLLP channel, on a free loopback
// address, that files every message under a temporary directory; it
// returns the file, the listen address and the directory.
func archiveConfig(t *testing.T) (file, addr, dir string) {
	t.Helper()
	addr, dir = unusedAddr(t), t.TempDir()
	file = filepath.Join(t.TempDir(), "mefor.yaml")
	writeFile(t, file, fmt.Sprintf(`channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [archive]}]
destinations:
  archive: {type: file, file: {directory: %q}}
`, addr, dir))
	return file, addr, dir
}
