package leader

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

const (
	testHeartbeat = 100 * time.Millisecond
	testFence     = 600 * time.Millisecond
	testTTL       = 1200 * time.Millisecond

	// Slower timings, for tests that hold a lease write on the row lock
	// and must see it blocked (and act) before it gives up after its
	// fence timeout: a 600ms fence is too short for that on a loaded machine.
	slowHeartbeat = 500 * time.Millisecond
	slowFence     = 4 * time.Second
	slowTTL       = 8 * time.Second
)

type probe struct {
	changed atomic.Int32
	drained atomic.Int32
	// fenced gets the time of the second gate change (acquired, then
	// closed) of tests that watch the fence.
	fenced chan time.Time
}

func newLease(t *testing.T, pool *pgxpool.Pool, id string) (*Lease, *probe) {
	t.Helper()
	return newLeaseTimed(t, pool, id, testHeartbeat, testFence, testTTL)
}

// holderAndStandby is two leases on pool at the test timings: a ticked
// first and holds the lease, b ticked after it; bp is b's probe.
func holderAndStandby(t *testing.T, pool *pgxpool.Pool) (a, b *Lease, bp *probe) {
	t.Helper()
	a, _ = newLease(t, pool, "a")
	b, bp = newLease(t, pool, "b")
	a.Tick(context.Background())
	b.Tick(context.Background())
	return a, b, bp
}

// newLeaseTimed is for tests that race the claim pause (two heartbeats)
// against a test goroutine: a long heartbeat keeps them correct on a loaded
// machine.
func newLeaseTimed(t *testing.T, pool *pgxpool.Pool, id string, hb, fence, ttl time.Duration) (*Lease, *probe) {
	t.Helper()
	p := &probe{fenced: make(chan time.Time, 1)}
	l, err := NewLease(LeaseConfig{
		Pool: pool, NodeID: id, Heartbeat: hb, FenceTimeout: fence, TTL: ttl,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Changed: func() {
			if p.changed.Add(1) == 2 {
				p.fenced <- time.Now()
			}
		},
		Drain: func(context.Context) { p.drained.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

type leaseRow struct {
	Owner   string
	Expired bool
	// Released: a release write landed (it sets released_at).
	Released bool
}

func readLease(t *testing.T, pool *pgxpool.Pool) leaseRow {
	t.Helper()
	var r leaseRow
	err := pool.QueryRow(context.Background(),
		`SELECT owner, expires_at <= clock_timestamp(), released_at IS NOT NULL FROM mefor_leader_lease WHERE key = 'listeners'`).Scan(&r.Owner, &r.Expired, &r.Released)
	if err != nil {
		t.Fatalf("read lease row: %v", err)
	}
	return r
}

// lockLeaseRow holds the lease row's lock from another transaction, so any
// write to it blocks until the returned func is called: a slow or hung
// release write, against the real database.
func lockLeaseRow(t *testing.T, pool *pgxpool.Pool) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM mefor_leader_lease WHERE key = 'listeners' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := false
	unlock = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(unlock)
	return unlock
}

// waitBlockedOnLease waits until a statement on the lease table waits for
// the row lock.
func waitBlockedOnLease(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%mefor_leader_lease%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no statement blocked on the lease row within 5s")
}

// blockOnLeaseRow runs write in a goroutine while another transaction holds
// the lease row's lock, and returns once write waits for it: unlock lets
// write through, and done closes when write returned.
func blockOnLeaseRow(t *testing.T, pool *pgxpool.Pool, write func()) (unlock func(), done <-chan struct{}) {
	t.Helper()
	unlock = lockLeaseRow(t, pool)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		write()
	}()
	waitBlockedOnLease(t, pool)
	return unlock, returned
}

// wantReleased fails the test unless the stepdown what answered r released
// the lease, and the lease row shows the release write landed.
func wantReleased(t *testing.T, pool *pgxpool.Pool, what string, r StepdownResult) {
	t.Helper()
	if r.Outcome != OutcomeReleased || r.ReleasedAt == nil {
		t.Fatalf("%s = %+v, want released with a time", what, r)
	}
	if got := readLease(t, pool); !got.Released {
		t.Fatalf("%s: the lease row is still live (%+v): the release write did not land", what, got)
	}
}

func TestLeaseSingleHolderAndTakeoverOnlyAfterExpiry(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	a, b, _ := holderAndStandby(t, db.Pool)
	if !a.Serving() || b.Serving() {
		t.Fatalf("after both tried: a serving=%v b serving=%v, want only a", a.Serving(), b.Serving())
	}
	// a keeps renewing: b never gets it.
	var lastRenewal time.Time
	for range 5 {
		time.Sleep(testHeartbeat)
		lastRenewal = time.Now() // the renewal executes after this
		a.Tick(ctx)
		b.Tick(ctx)
		if b.Serving() {
			t.Fatal("b took a lease that a renews every heartbeat")
		}
	}
	// a goes silent: b may take over only once the lease expired on the
	// database clock.
	for !b.Serving() {
		if time.Since(lastRenewal) > 5*testTTL {
			t.Fatal("b never took over an expired lease")
		}
		b.Tick(ctx)
		if b.Serving() && time.Since(lastRenewal) < testTTL {
			t.Fatalf("b took over %v after a's last renewal, before the %v TTL", time.Since(lastRenewal), testTTL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// a's next renewal attempt finds b's live lease and closes its gate.
	a.Tick(ctx)
	if a.Serving() {
		t.Fatal("a still serving after b took the lease")
	}
	if got := readLease(t, db.Pool); got.Owner != "b" || got.Expired {
		t.Fatalf("lease row = %+v, want live and owned by b", got)
	}
}

// A holder that cannot renew closes its gate before its lease can expire,
// with no help from the database.
func TestFenceWatchdogClosesGateBeforeExpiry(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, p := newLease(t, db.Pool, "a")
	a.Tick(ctx)
	if !a.Serving() {
		t.Fatal("a did not acquire a free lease")
	}
	// Every renewal from now on hangs on the row lock, like a database that
	// stopped answering.
	lockLeaseRow(t, db.Pool)
	go a.Run(ctx)
	var fencedAt time.Time
	select {
	case fencedAt = <-p.fenced:
	case <-time.After(10 * testTTL):
		t.Fatal("the gate never closed while renewals hung")
	}
	if a.Serving() {
		t.Fatal("fenced but still serving")
	}
	// The gate closed before the lease could pass to anyone. The database
	// runs on this host's clock, so the two times compare.
	var expires time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT expires_at FROM mefor_leader_lease`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if !fencedAt.Before(expires) {
		t.Fatalf("fenced at %v, after the lease expired at %v", fencedAt, expires)
	}
	t.Logf("fenced %v before the lease expired", expires.Sub(fencedAt))
}

// A frozen process resumes with a stale renewal: Serving must say no at
// once, without waiting for the watchdog goroutine to be scheduled.
func TestServingChecksRenewalAgeItself(t *testing.T) {
	db := testcontainers.NewDB(t)
	a, _ := newLease(t, db.Pool, "a")
	a.Tick(context.Background())
	if !a.Serving() {
		t.Fatal("a did not acquire")
	}
	time.Sleep(testFence + 50*time.Millisecond) // no watchdog running: a "freeze"
	if a.Serving() {
		t.Fatal("serving on a renewal older than fence_timeout")
	}
}

func TestStepdownRules(t *testing.T) {
	ctx := context.Background()
	const hb, fence, ttl = slowHeartbeat, slowFence, slowTTL

	// The gate is closed, and the listeners drained, before the release
	// write: nothing acts as holder while the write is in flight.
	t.Run("demotes before the release write", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, p := newLeaseTimed(t, db.Pool, "a", hb, fence, ttl)
		a.Tick(ctx)
		var r StepdownResult
		unlock, done := blockOnLeaseRow(t, db.Pool, func() { r = a.StepDown(ctx) })
		if a.Serving() {
			t.Error("still serving while the release write is in flight")
		}
		if p.drained.Load() != 1 {
			t.Error("listeners not drained before the release write")
		}
		unlock()
		<-done
		wantReleased(t, db.Pool, "stepdown", r)
		if !r.WasHolder {
			t.Fatalf("stepdown = %+v, want one of the holder", r)
		}
	})

	// A slow release write must not use up the claim pause: right after it
	// returns, this node still declines to claim, so a standby can.
	t.Run("pause re-armed after a slow write", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, _ := newLeaseTimed(t, db.Pool, "a", hb, fence, ttl)
		b, _ := newLeaseTimed(t, db.Pool, "b", hb, fence, ttl)
		a.Tick(ctx)
		var r StepdownResult
		unlock, done := blockOnLeaseRow(t, db.Pool, func() { r = a.StepDown(ctx) })
		time.Sleep(3 * hb) // longer than the pause
		unlock()
		if <-done; r.Outcome != OutcomeReleased {
			t.Fatalf("stepdown = %+v, want released", r)
		}
		a.Tick(ctx) // the renew branch would take the lease straight back
		if a.Serving() {
			t.Fatal("the releasing node re-claimed at once: the slow write spent its pause")
		}
		b.Tick(ctx)
		if !b.Serving() {
			t.Fatal("standby could not take the released lease")
		}
	})

	// A request cancelled while the write is in flight still leaves the
	// pause armed.
	t.Run("cancelled request still arms the pause", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, _ := newLeaseTimed(t, db.Pool, "a", hb, fence, ttl)
		a.Tick(ctx)
		cctx, cancel := context.WithCancel(ctx)
		var r StepdownResult
		unlock, done := blockOnLeaseRow(t, db.Pool, func() { r = a.StepDown(cctx) })
		cancel()
		<-done
		unlock()
		if r.Outcome != OutcomeReleaseUnconfirmed {
			t.Fatalf("cancelled stepdown = %+v, want release-unconfirmed", r)
		}
		a.Tick(ctx)
		if a.Serving() {
			t.Fatal("re-claimed right after a cancelled stepdown: the pause was not armed")
		}
	})

	// A renewal already in flight when the stepdown arrives must finish
	// before the release, or its late "held" answer would re-promote a
	// node whose lease was just expired.
	t.Run("tick in flight cannot re-promote", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, _ := newLeaseTimed(t, db.Pool, "a", hb, fence, ttl)
		a.Tick(ctx)
		unlock, tickDone := blockOnLeaseRow(t, db.Pool, func() { a.Tick(ctx) })
		res := make(chan StepdownResult, 1)
		go func() { res <- a.StepDown(ctx) }()
		time.Sleep(50 * time.Millisecond)
		unlock()
		<-tickDone
		r := <-res
		if r.Outcome != OutcomeReleased {
			t.Fatalf("stepdown = %+v, want released", r)
		}
		if a.Serving() {
			t.Fatal("the in-flight renewal re-promoted the node after its stepdown")
		}
		if got := readLease(t, db.Pool); !got.Released {
			t.Fatal("lease live after the stepdown: the renewal landed after the release")
		}
	})

	// The wait for the maintenance lock is bounded; a timeout changes
	// nothing.
	t.Run("lock wait bounded and refusal untouched", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, p := newLease(t, db.Pool, "a")
		a.Tick(ctx)
		a.sem <- struct{}{} // a tick that does not come back
		res := make(chan StepdownResult, 1)
		go func() { res <- a.StepDown(ctx) }()
		var r StepdownResult
		select {
		case r = <-res:
		case <-time.After(3 * testFence):
			t.Fatal("stepdown waited for the lock past 3×fence_timeout")
		}
		<-a.sem
		if r.Outcome != OutcomeLockTimeout {
			t.Fatalf("stepdown = %+v, want lock-timeout", r)
		}
		if !a.held.Load() || p.changed.Load() != 1 || p.drained.Load() != 0 {
			t.Fatal("a lock-timeout refusal touched leadership")
		}
		if got := readLease(t, db.Pool); got.Owner != "a" || got.Released {
			t.Fatalf("lease row changed by a refusal: %+v", got)
		}
	})

	// A write that does not return is a refusal, and the node owes it: the
	// retry sends it again even though the gate is already closed.
	t.Run("unconfirmed write is owed and retried", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, _ := newLease(t, db.Pool, "a")
		a.Tick(ctx)
		unlock := lockLeaseRow(t, db.Pool)
		r := a.StepDown(ctx) // the write times out after fence_timeout
		unlock()
		if r.Outcome != OutcomeReleaseUnconfirmed || r.ReleasedAt != nil {
			t.Fatalf("stepdown with a hung write = %+v, want release-unconfirmed", r)
		}
		if a.Serving() {
			t.Fatal("serving after an unconfirmed release")
		}
		// Whether the abandoned write still lands once the row lock goes is
		// up to the server (it does not notice the client gave up while it
		// waits for a lock): exactly why the refusal cannot claim either.
		// The retry must send the write either way.
		wantReleased(t, db.Pool, "retried stepdown", a.StepDown(ctx))
	})

	// A holder that fenced itself still owns a live lease row: a stepdown
	// releases it rather than answering "not the holder".
	t.Run("self-fenced holder can still be stepped down", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, _ := newLeaseTimed(t, db.Pool, "a", hb, fence, ttl)
		a.Tick(ctx)
		a.held.Store(false) // what the watchdog does, without the wait
		wantReleased(t, db.Pool, "stepdown of a self-fenced holder", a.StepDown(ctx))
		a.Tick(ctx)
		if a.Serving() {
			t.Fatal("re-claimed right after the stepdown")
		}
	})

	// A stepdown addressed to a standby sends nothing and arms nothing.
	t.Run("non-holder changes nothing", func(t *testing.T) {
		db := testcontainers.NewDB(t)
		a, b, p := holderAndStandby(t, db.Pool)
		if r := b.StepDown(ctx); r.Outcome != OutcomeNotHolder || r.WasHolder {
			t.Fatalf("stepdown on standby = %+v, want not-holder", r)
		}
		if got := readLease(t, db.Pool); got.Owner != "a" || got.Expired || !a.Serving() || p.changed.Load() != 0 {
			t.Fatalf("a stepdown of a standby changed the lease: %+v", got)
		}
		// No pause was armed on b: once a releases, b takes over at once.
		if r := a.StepDown(ctx); r.Outcome != OutcomeReleased {
			t.Fatalf("stepdown of holder = %+v", r)
		}
		b.Tick(ctx)
		if !b.Serving() {
			t.Fatal("standby paused by a stepdown it refused")
		}
	})
}

// Requests reach the holder through the database, and every answer is
// audited with what happened.
func TestControlAnswersAndAudits(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	a, b, _ := holderAndStandby(t, db.Pool)
	ca := &Control{Pool: db.Pool, NodeID: "a", Lease: a, Heartbeat: testHeartbeat, Logger: a.cfg.Logger}
	cb := &Control{Pool: db.Pool, NodeID: "b", Lease: b, Heartbeat: testHeartbeat, Logger: b.cfg.Logger}

	var toB, toA int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO mefor_control_request (kind, target_node) VALUES ('stepdown', 'b') RETURNING id`).Scan(&toB); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `INSERT INTO mefor_control_request (kind, target_node) VALUES ('stepdown', 'a') RETURNING id`).Scan(&toA); err != nil {
		t.Fatal(err)
	}
	if err := cb.poll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ca.poll(ctx); err != nil {
		t.Fatal(err)
	}

	type audit struct {
		Outcome    string
		WasHolder  bool
		ReleasedAt *time.Time
		Reason     *string
	}
	read := func(id int64) (audit, map[string]any) {
		var a audit
		var out map[string]any
		err := db.Pool.QueryRow(ctx, `
			SELECT s.outcome, s.was_holder, s.released_at, s.reason, r.outcome
			FROM mefor_stepdown_audit s JOIN mefor_control_request r ON r.id = s.request_id
			WHERE s.request_id = $1 AND r.status = 'answered'`, id).Scan(&a.Outcome, &a.WasHolder, &a.ReleasedAt, &a.Reason, &out)
		if err == pgx.ErrNoRows {
			t.Fatalf("request %d has no audited answer", id)
		}
		if err != nil {
			t.Fatal(err)
		}
		return a, out
	}
	gotB, outB := read(toB)
	if gotB.Outcome != OutcomeNotHolder || gotB.WasHolder || gotB.ReleasedAt != nil || gotB.Reason == nil {
		t.Errorf("standby's audit = %+v, want not-holder with a reason", gotB)
	}
	if outB["holder"] != "a" {
		t.Errorf("standby's answer names holder %v, want a", outB["holder"])
	}
	gotA, _ := read(toA)
	if gotA.Outcome != OutcomeReleased || !gotA.WasHolder || gotA.ReleasedAt == nil {
		t.Errorf("holder's audit = %+v, want released with a time", gotA)
	}
}

// The lease's safety rests on heartbeat < fence_timeout < lease_ttl: a
// fence no longer than a heartbeat fences a healthy holder, a fence no
// shorter than the TTL lets another node take the lease while the holder
// still serves. NewLease refuses both, whoever builds the lease.
func TestNewLeaseRefusesUnsafeTimings(t *testing.T) {
	db := testcontainers.NewDB(t)
	for _, tc := range []struct {
		hb, fence, ttl time.Duration
		want           string
	}{
		{time.Second, time.Second, 5 * time.Second, "must be longer than the heartbeat"},
		{time.Second, 5 * time.Second, 5 * time.Second, "must be longer than the fence timeout"},
		{0, time.Second, 2 * time.Second, "heartbeat must be positive"},
	} {
		_, err := NewLease(LeaseConfig{Pool: db.Pool, NodeID: "n", Heartbeat: tc.hb, FenceTimeout: tc.fence, TTL: tc.ttl})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("heartbeat %s, fence %s, ttl %s: %v, want an error saying it %s", tc.hb, tc.fence, tc.ttl, err, tc.want)
		}
	}
	if _, err := NewLease(LeaseConfig{Pool: db.Pool, NodeID: "n", Heartbeat: time.Second, FenceTimeout: 3 * time.Second, TTL: 5 * time.Second}); err != nil {
		t.Errorf("the default timings: %v", err)
	}
}

// A node frozen with its claim in flight reads, on resuming, an answer the
// database gave before the freeze. That answer must not count as holding
// the lease: the node would announce it (and bind its listeners) while
// another node may have taken the lease meanwhile.
func TestLateClaimAnswerDoesNotAcquire(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	b, _ := newLease(t, db.Pool, "b")
	b.Tick(ctx)
	if !b.Serving() {
		t.Fatal("b did not acquire")
	}
	time.Sleep(testTTL + 100*time.Millisecond) // b's lease expires: a may take it over

	// Slow timings: the test must see a's claim blocked before it gives up.
	// a's clock is the test's, so nothing else here depends on them.
	a, p := newLeaseTimed(t, db.Pool, "a", slowHeartbeat, slowFence, slowTTL)
	var now atomic.Int64
	now.Store(int64(time.Second))
	a.clock = now.Load
	unlock, done := blockOnLeaseRow(t, db.Pool, func() { a.Tick(ctx) })
	now.Add(int64(2 * slowFence)) // a is frozen, its claim in flight
	unlock()
	<-done
	if a.held.Load() || p.changed.Load() != 0 {
		t.Fatalf("an answer older than fence_timeout counted as acquiring the lease (held %v, gate changes %d)",
			a.held.Load(), p.changed.Load())
	}
	// The next tick, answered in time, takes the expired lease.
	a.Tick(ctx)
	if !a.Serving() {
		t.Fatal("a did not acquire on an answer in time")
	}
}

// newRankedLease is a lease and its membership (joined) with a listener
// priority; never builds one of priority 0.
func newRankedLease(t *testing.T, pool *pgxpool.Pool, id string, priority int, never bool) *Lease {
	t.Helper()
	m, err := NewMembership(MembershipConfig{Pool: pool, NodeID: id, Heartbeat: testHeartbeat, NodeTimeout: 3 * testTTL,
		ListenerPriority: priority, NeverListens: never})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := NewLease(LeaseConfig{Pool: pool, NodeID: id, Heartbeat: testHeartbeat, FenceTimeout: testFence, TTL: testTTL,
		Priority: priority, Never: never, Membership: m})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A node takes the expired lease over only when no live node of a higher
// priority could (the lease's last owner aside), or once the lease has
// stayed free for lease_ttl since it expired; a node of priority 0 never
// takes it, even alone. Without priorities (all 1) the first to tick wins,
// as before.
func TestListenerPriorityDecidesWhoTakesOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dr := newRankedLease(t, db.Pool, "dr", 0, true)
	low := newRankedLease(t, db.Pool, "low", 1, false)

	// Alone with no lease row, the priority-0 node inserts none.
	dr.Tick(ctx)
	if dr.Serving() {
		t.Fatal("the priority-0 node took the listeners")
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_leader_lease`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("lease rows after the priority-0 node's tick: %d, %v", rows, err)
	}

	// The high node joins and takes the lease first; the others stand by.
	high := newRankedLease(t, db.Pool, "high", 2, false)
	high.Tick(ctx)
	low.Tick(ctx)
	dr.Tick(ctx)
	if !high.Serving() || low.Serving() || dr.Serving() {
		t.Fatalf("serving: high %v, low %v, dr %v; want only high", high.Serving(), low.Serving(), dr.Serving())
	}

	// The high node dies: its lease expires. Its last owner does not
	// count against the low node, which takes over; dr never does.
	expire := func() {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `UPDATE mefor_leader_lease SET expires_at = clock_timestamp() - interval '1 millisecond'`); err != nil {
			t.Fatal(err)
		}
	}
	expire()
	dr.Tick(ctx)
	low.Tick(ctx)
	if !low.Serving() || dr.Serving() || readLease(t, db.Pool).Owner != "low" {
		t.Fatalf("after the holder died: low serving %v, dr serving %v, owner %q; want low", low.Serving(), dr.Serving(), readLease(t, db.Pool).Owner)
	}

	// With the low node's lease expired too (it died), a live node of a
	// higher priority comes first: another priority-1 node may not take
	// it while "high" (live, not the last owner) could.
	low2 := newRankedLease(t, db.Pool, "low2", 1, false)
	expire()
	low2.Tick(ctx)
	if low2.Serving() {
		t.Fatal("a priority-1 node took the lease while a live priority-2 node could")
	}
	// ... until the lease has stayed free for lease_ttl.
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_leader_lease SET expires_at = clock_timestamp() - $1::bigint * interval '1 microsecond' - interval '1 millisecond'`,
		testTTL.Microseconds()); err != nil {
		t.Fatal(err)
	}
	low2.Tick(ctx)
	if !low2.Serving() {
		t.Fatal("a lease free for longer than lease_ttl was not taken by the live priority-1 node")
	}
	// The priority-0 node is left alone with an expired lease: still never.
	expire()
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_node SET status = 'left' WHERE id <> 'dr'`); err != nil {
		t.Fatal(err)
	}
	dr.Tick(ctx)
	if dr.Serving() || readLease(t, db.Pool).Owner == "dr" {
		t.Fatal("the priority-0 node took the listeners as the last node alive")
	}
}

// A stepdown hands the lease to the best-priority live node: the
// priority-1 standby waits while the priority-2 one takes it.
func TestStepdownHandsOverToTheBestPriority(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	holder := newRankedLease(t, db.Pool, "holder", 1, false)
	holder.Tick(ctx)
	low := newRankedLease(t, db.Pool, "low", 1, false)
	best := newRankedLease(t, db.Pool, "best", 2, false)
	if r := holder.StepDown(ctx); r.Outcome != OutcomeReleased {
		t.Fatalf("stepdown: %+v", r)
	}
	low.Tick(ctx)
	if low.Serving() {
		t.Fatal("the priority-1 standby took the released lease ahead of the live priority-2 one")
	}
	best.Tick(ctx)
	if !best.Serving() {
		t.Fatal("the priority-2 standby did not take the released lease")
	}
}
