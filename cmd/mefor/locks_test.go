package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
)

// After `mefor migrate`, a login without a mefor role cannot connect, and
// no login but a node's can take the locks intake and delivery wait for:
// a stranger let in by hand, a reader and an operator each try the ingress
// and outbound lanes' locks, hold their sessions (and transactions) open,
// and a message sent over MLLP is still acknowledged AA and delivered.
func TestStrangersAndReadersCannotHoldIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	code, out, errs := as(t, db.URL, "migrate")
	if code != 0 {
		t.Fatalf("migrate: %d %s %s", code, out, errs)
	}
	if !strings.Contains(out, "revoked CONNECT and TEMP on this database from PUBLIC") {
		t.Errorf("migrate does not say it closed the database:\n%s", out)
	}
	if strings.Contains(errs, "warning") {
		t.Errorf("migrate as a superuser warns: %s", errs)
	}

	// A stranger: a login with no mefor role cannot even connect.
	_, strangerURL := newLogin(t, db, "")
	if conn, err := pgx.Connect(ctx, strangerURL); err == nil {
		_ = conn.Close(ctx)
		t.Errorf("a login without a mefor role connected to mefor's database")
	} else if !migrations.IsPermissionDenied(err) {
		t.Errorf("stranger's connection: %v; want permission denied", err)
	}
	// Nor can it create temporary objects if someone lets it in.
	guest, guestURL := newLogin(t, db, "")
	if _, err := db.Pool.Exec(ctx, "GRANT CONNECT ON DATABASE "+db.Name+" TO "+guest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "REVOKE ALL ON DATABASE "+db.Name+" FROM "+guest) })
	_, readerURL := newLogin(t, db, migrations.RoleReader)
	_, operatorURL := newLogin(t, db, migrations.RoleOperator)

	file, addr, dir := archiveConfig(t)

	// The node runs as an admin login, so the grants it needs are checked too.
	_, admin := newLogin(t, db, migrations.RoleAdmin)
	pool, err := pgxpool.New(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	inProcessNode(t, &testcontainers.DB{Name: db.Name, URL: admin, Server: db.Server, Pool: pool}, "node-locks", file)
	lanes := []string{jobs.IngressLane("adt"), "routed:adt", "outbound:archive"}
	holders := map[string]string{"guest": guestURL, "reader": readerURL, "operator": operatorURL}
	// Everything from here on is bounded, so that a lock someone did take
	// fails the test rather than hanging it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for who, u := range holders {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("%s connects: %v", who, err)
		}
		defer func() { _ = conn.Close(context.Background()) }()
		if who == "guest" {
			if _, err := conn.Exec(ctx, "CREATE TEMP TABLE t (x int)"); !migrations.IsPermissionDenied(err) {
				t.Errorf("guest creates a temporary table: %v; want permission denied", err)
			}
		}
		// Session locks outlive any transaction: nobody but a node takes them.
		for _, lane := range lanes {
			class, key := jobs.LaneLock(lane)
			for _, f := range []string{"pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_lock_shared"} {
				_, err := conn.Exec(ctx, "SELECT "+f+"($1, $2)", class, key)
				if !migrations.IsPermissionDenied(err) {
					t.Errorf("%s: %s on lane %s: %v; want permission denied", who, f, lane, err)
				}
			}
		}
		// Transaction locks, held in a transaction left open.
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		for _, lane := range lanes {
			class, key := jobs.LaneLock(lane)
			for _, f := range []string{"pg_advisory_xact_lock", "pg_try_advisory_xact_lock"} {
				if _, err := conn.Exec(ctx, "SAVEPOINT s"); err != nil {
					t.Fatal(err)
				}
				_, err := conn.Exec(ctx, "SELECT "+f+"($1, $2)", class, key)
				if !migrations.IsPermissionDenied(err) {
					t.Errorf("%s: %s on lane %s: %v; want permission denied", who, f, lane, err)
				}
				// A lock taken is kept: rolling back to the savepoint would
				// release it.
				end := "ROLLBACK TO SAVEPOINT s"
				if err == nil {
					end = "RELEASE SAVEPOINT s"
				}
				if _, err := conn.Exec(ctx, end); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	c := &mllp.Client{Addr: addr, AckTimeout: 20 * time.Second}
	defer c.Close()
	sendCtx, cancelSend := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSend()
	ack, err := c.Send(sendCtx, []byte(strings.Replace(fixtureBody, "%d", "1", 1)))
	if err != nil {
		t.Fatalf("send while others try the lane locks: %v", err)
	}
	if a, err := hl7.ParseACK(ack); err != nil || a.Code != hl7.AckAccept {
		t.Fatalf("ACK %+v (%v) while others try the lane locks; want AA", a, err)
	}
	cluster.Poll(t, 30*time.Second, "the message delivered to the file destination", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 1
	})
}

// A node's own session may hold a lane lock in a transaction it left open
// (a node frozen mid-transaction, or an administrator with a node's role).
// That does not stall intake without end: past
// intake's lock_timeout the sender gets no ACK and its connection is closed,
// nothing is stored, the refusal is counted as lock-timeout, and the same
// message is acknowledged AA and delivered once the lock is released.
func TestLaneLockHeldOpenRefusesIntakeInsteadOfHanging(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testcontainers.NewDB(t)
	if code, out, errs := as(t, db.URL, "migrate"); code != 0 {
		t.Fatalf("migrate: %d %s %s", code, out, errs)
	}
	_, adminURL := newLogin(t, db, migrations.RoleAdmin)
	file, addr, dir := archiveConfig(t)
	node := inProcessNode(t, db, "node-held", file)

	op, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Close(context.Background()) }()
	class, key := jobs.LaneLock(jobs.IngressLane("adt"))
	if _, err := op.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", class, key); err != nil {
		t.Fatalf("a node's role takes a lane lock for its transaction: %v", err)
	}

	msg := []byte(strings.Replace(fixtureBody, "%d", "1", 1))
	c := &mllp.Client{Addr: addr, AckTimeout: time.Minute}
	if ack, err := c.Send(ctx, msg); err == nil {
		t.Fatalf("ACK %q while the lane was held; want the connection closed without one", ack)
	}
	c.Close()
	if n := rejected(t, node, "lock-timeout"); n != 1 {
		t.Errorf("mefor_messages_rejected_total{reason=lock-timeout} = %v, want 1", n)
	}
	var stored int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM mefor_message").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 0 {
		t.Errorf("%d messages stored by a refused intake; want none", stored)
	}

	if _, err := op.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	c = &mllp.Client{Addr: addr, AckTimeout: 20 * time.Second}
	defer c.Close()
	ack, err := c.Send(ctx, msg)
	if err != nil {
		t.Fatalf("send after the lock was released: %v", err)
	}
	if a, err := hl7.ParseACK(ack); err != nil || a.Code != hl7.AckAccept {
		t.Fatalf("ACK %+v (%v) after the lock was released; want AA", a, err)
	}
	cluster.Poll(t, 30*time.Second, "the message delivered to the file destination", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 1
	})
}

// rejected reads mefor_messages_rejected_total{channel="adt",reason} from
// the node's registry, as a scrape would.
func rejected(t *testing.T, n *engine.Node, reason string) float64 {
	t.Helper()
	fams, err := n.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "mefor_messages_rejected_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["channel"] == "adt" && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
