package leader

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/testcontainers"
)

// These tests hold the membership to its heartbeat (one write a beat with
// the lease, a renewal that never waits for the node's row) and to how
// every reader judges a node's row by the timings the node recorded.

func newMembership(t *testing.T, pool *pgxpool.Pool, id string, holds func() bool) *Membership {
	t.Helper()
	m, err := NewMembership(MembershipConfig{Pool: pool, NodeID: id, Heartbeat: testHeartbeat, NodeTimeout: 3 * testTTL,
		HoldsLease: holds})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// nodeRow is what the node listing is built from, and the transaction that
// last wrote it.
type nodeRow struct {
	LastSeen   time.Time
	HoldsLease bool
	Xmin       string
}

func readNode(t *testing.T, pool *pgxpool.Pool, id string) nodeRow {
	t.Helper()
	var r nodeRow
	if err := pool.QueryRow(context.Background(),
		`SELECT last_seen, holds_lease, xmin::text FROM mefor_node WHERE id = $1`, id).Scan(&r.LastSeen, &r.HoldsLease, &r.Xmin); err != nil {
		t.Fatalf("read node %s: %v", id, err)
	}
	return r
}

// A lease built with the membership refreshes the node's row in the
// transaction that renews (or tries to take) the lease, and the
// membership's own loop then has nothing to write: an idle node makes one
// write a heartbeat, not two. When the renewal stops (a claim pause, a
// stuck maintenance lock) the loop beats on its own.
func TestRenewalCarriesHeartbeat(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	var a, b *Lease
	ma := newMembership(t, db.Pool, "a", func() bool { return a.Serving() })
	mb := newMembership(t, db.Pool, "b", func() bool { return b.Serving() })
	newWith := func(id string, m *Membership) *Lease {
		l, err := NewLease(LeaseConfig{Pool: db.Pool, NodeID: id, Heartbeat: testHeartbeat, FenceTimeout: testFence, TTL: testTTL,
			Logger: slog.New(slog.DiscardHandler), Membership: m})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b = newWith("a", ma), newWith("b", mb)
	joinedA, joinedB := readNode(t, db.Pool, "a"), readNode(t, db.Pool, "b")
	time.Sleep(2 * testHeartbeat) // neither membership is fresh any more

	a.Tick(ctx)
	b.Tick(ctx)
	var leaseXmin string
	if err := db.Pool.QueryRow(ctx, `SELECT xmin::text FROM mefor_leader_lease WHERE key = $1`, ListenerLeaseKey).Scan(&leaseXmin); err != nil {
		t.Fatal(err)
	}
	ra, rb := readNode(t, db.Pool, "a"), readNode(t, db.Pool, "b")
	if !a.Serving() || b.Serving() {
		t.Fatalf("a serving %v, b serving %v; want a alone", a.Serving(), b.Serving())
	}
	if ra.Xmin != leaseXmin {
		t.Errorf("holder's row written by transaction %s, the lease by %s: the heartbeat is not in the renewal", ra.Xmin, leaseXmin)
	}
	if !ra.LastSeen.After(joinedA.LastSeen) || !rb.LastSeen.After(joinedB.LastSeen) {
		t.Errorf("last_seen not refreshed by the lease ticks: a %v -> %v, b %v -> %v",
			joinedA.LastSeen, ra.LastSeen, joinedB.LastSeen, rb.LastSeen)
	}
	if !ra.HoldsLease || rb.HoldsLease {
		t.Errorf("holds_lease a=%v b=%v, want a alone", ra.HoldsLease, rb.HoldsLease)
	}
	if !ma.Fresh(testHeartbeat) || !mb.Fresh(testHeartbeat) {
		t.Error("a beat carried by the renewal does not count as this node's heartbeat")
	}

	// Right after a renewal the membership loop has nothing to write.
	if ma.tick(ctx) {
		t.Error("membership beat on its own right after the renewal beat for it")
	}
	if got := readNode(t, db.Pool, "a"); got.Xmin != ra.Xmin {
		t.Errorf("node row rewritten (transaction %s -> %s) though the renewal had just beaten", ra.Xmin, got.Xmin)
	}
	// Without renewals (here: no lease ticks at all) it beats on its own.
	time.Sleep(2 * testHeartbeat)
	if !ma.tick(ctx) {
		t.Fatal("membership did not beat though no renewal beat for a heartbeat")
	}
	got := readNode(t, db.Pool, "a")
	if got.Xmin == ra.Xmin || !got.LastSeen.After(ra.LastSeen) || !got.HoldsLease {
		t.Errorf("standalone beat: %+v after %+v, want a newer row still holding the lease", got, ra)
	}
}

// A request whose notification the node never got (it was sent by hand
// here, as one lost while the listener reconnected would be) is still
// answered by the listening node's slow poll; a request past its age is
// abandoned in the same statement rather than acted on.
func TestControlPollsWithoutNotification(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	a, _ := newLease(t, db.Pool, "a")
	c := &Control{Pool: db.Pool, NodeID: "a", Lease: a, Heartbeat: testHeartbeat, PollEvery: 300 * time.Millisecond,
		Logger: a.cfg.Logger}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var old int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO mefor_control_request (kind, target_node, requested_at)
		VALUES ('no-such-kind', 'a', clock_timestamp() - interval '2 minutes') RETURNING id`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	// Past the poll at connect, so only the slow poll can find it.
	time.Sleep(time.Second)
	var fresh int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO mefor_control_request (kind, target_node) VALUES ('no-such-kind', 'a') RETURNING id`).Scan(&fresh); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		status, _, err := RequestAnswer(ctx, db.Pool, fresh)
		if err != nil {
			t.Fatal(err)
		}
		if status == "answered" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request without a notification still %s after 5s (poll every %s)", status, c.PollEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
	status, _, err := RequestAnswer(ctx, db.Pool, old)
	if err != nil {
		t.Fatal(err)
	}
	if status != "abandoned" {
		t.Errorf("request older than %s is %s, want abandoned", requestMaxAge, status)
	}
}

// The renewal does not wait for the node's row: while another transaction
// holds it, the lease is still renewed in time, and the beat is left to the
// membership loop.
func TestRenewalDoesNotWaitForNodeRow(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	m := newMembership(t, db.Pool, "a", nil)
	a, err := NewLease(LeaseConfig{Pool: db.Pool, NodeID: "a", Heartbeat: testHeartbeat, FenceTimeout: testFence, TTL: testTTL,
		Logger: slog.New(slog.DiscardHandler), Membership: m})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * testHeartbeat)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM mefor_node WHERE id = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	a.Tick(ctx) // would block until the fence timeout, and fail, if it waited
	if !a.Serving() {
		t.Fatal("renewal did not take the lease while the node row was locked")
	}
	if m.Fresh(testHeartbeat) {
		t.Error("a beat that was skipped counts as confirmed")
	}
}

// Each node is judged by the timings it recorded when it joined: a node
// silent for 5s is dead if its node_timeout is 3s, and only stale if it is a
// minute, whatever any reader's config says. A node that left is dead at
// once. Every reader agrees: the dead list reclaim uses, the live flag of the
// config status, the node listing.
func TestNodesJudgedByTheirOwnTimeouts(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_node (id, host, pid, last_seen, status, heartbeat_ms, node_timeout_ms) VALUES
			('short', 'h', 1, clock_timestamp() - interval '5 seconds', 'active', 1000, 3000),
			('long', 'h', 2, clock_timestamp() - interval '5 seconds', 'active', 1000, 60000),
			('fresh', 'h', 3, clock_timestamp(), 'active', 1000, 3000),
			('gone', 'h', 4, clock_timestamp(), 'left', 1000, 60000)`); err != nil {
		t.Fatal(err)
	}
	dead, err := DeadNodes(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gone", "short"}; !slices.Equal(dead, want) {
		t.Errorf("dead nodes %v, want %v", dead, want)
	}
	st, err := ReadConfigStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, n := range st.Nodes {
		live[n.Node] = n.Live
	}
	for id, want := range map[string]bool{"short": false, "long": true, "fresh": true, "gone": false} {
		if live[id] != want {
			t.Errorf("config status: node %s live %v, want %v", id, live[id], want)
		}
	}
	nodes, err := ListNodes(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, n := range nodes {
		status[n.ID] = n.Status
	}
	for id, want := range map[string]string{"short": NodeStale, "long": NodeStale, "fresh": NodeActive, "gone": NodeLeft} {
		if status[id] != want {
			t.Errorf("listing: node %s %s, want %s", id, status[id], want)
		}
	}
}
