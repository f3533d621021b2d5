package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/tick"
)

// ListenerLeaseKey names the lease whose holder binds the inbound listeners.
const ListenerLeaseKey = "listeners"

// Stepdown outcomes, as written to the audit table and answered to the CLI.
const (
	OutcomeReleased           = "released"
	OutcomeNotHolder          = "not-holder"
	OutcomeLockTimeout        = "lock-timeout"
	OutcomeReleaseUnconfirmed = "release-unconfirmed"
)

// LeaseConfig configures a Lease. NewLease checks the timings the lease's
// safety rests on.
type LeaseConfig struct {
	Pool   *pgxpool.Pool
	NodeID string
	// Key names the leased duty; ListenerLeaseKey when empty.
	Key string
	// Heartbeat is how often the lease is renewed.
	Heartbeat time.Duration
	// FenceTimeout is how long the holder keeps serving without a confirmed
	// renewal: it must be longer than Heartbeat, so a late renewal or two
	// do not fence a healthy holder, and shorter than TTL, so the holder
	// has stopped before another node may take the lease over.
	FenceTimeout time.Duration
	// TTL is how long the lease stays valid, on the database clock, after
	// the renewal that set it.
	TTL time.Duration
	// Logger should carry the node id: every lease edge is logged once
	// through it. Defaults to discarding.
	Logger *slog.Logger
	// Changed is called whenever the gate opens or closes, from whichever
	// goroutine moved it. It must not block: the fence watchdog calls it.
	Changed func()
	// Drain is called by StepDown after the gate closed and before the
	// release write, so messages already accepted can finish (and be
	// acknowledged) while the lease is still this node's.
	Drain func(ctx context.Context)
	// Priority is this node's listener priority: it takes an expired lease
	// over only when no live node of a higher priority (other than the
	// lease's last owner) could, or when the lease has stayed expired for
	// TTL since (those nodes had their chance). The membership records it
	// on the node's row, where the other nodes read it. Defaults to 1.
	Priority int
	// Never keeps this node from ever taking the lease
	// (cluster.listener_priority 0); it still heartbeats.
	Never bool
	// Membership, when set, is this node's heartbeat: every renewal
	// statement also refreshes the node's row (holds_lease from the claim's
	// own outcome), so an idle node makes one write a heartbeat for both
	// instead of two. Its Run loop still beats on its own whenever the
	// renewal did not. Nil: the lease writes only the lease.
	Membership *Membership
}

// NewLease returns a lease, or an error when its timings do not keep
// Heartbeat < FenceTimeout < TTL (the config loader refuses such files
// too; this refuses them for every caller).
func NewLease(cfg LeaseConfig) (*Lease, error) {
	if err := checkNode("lease", cfg.Pool, cfg.NodeID, cfg.Heartbeat); err != nil {
		return nil, err
	}
	switch {
	case cfg.FenceTimeout <= cfg.Heartbeat:
		return nil, fmt.Errorf("lease: fence timeout (%s) must be longer than the heartbeat (%s), or one late renewal fences a healthy holder",
			cfg.FenceTimeout, cfg.Heartbeat)
	case cfg.TTL <= cfg.FenceTimeout:
		return nil, fmt.Errorf("lease: TTL (%s) must be longer than the fence timeout (%s), or another node may take the lease while the holder still serves",
			cfg.TTL, cfg.FenceTimeout)
	}
	if cfg.Key == "" {
		cfg.Key = ListenerLeaseKey
	}
	cfg.Priority = EffectivePriority(cfg.Priority, cfg.Never)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	return &Lease{cfg: cfg, base: time.Now(), sem: make(chan struct{}, 1)}, nil
}

// EffectivePriority is the listener priority a node claims and records
// with: 0 when it must never take the lease, else priority, 1 when unset.
func EffectivePriority(priority int, never bool) int {
	switch {
	case never:
		return 0
	case priority <= 0:
		return 1
	}
	return priority
}

// FenceTimeout is how long the holder serves without a confirmed renewal.
func (l *Lease) FenceTimeout() time.Duration { return l.cfg.FenceTimeout }

// Lease keeps one node's claim on a leased duty: it acquires the lease when
// it is free, renews it every heartbeat, and closes its in-memory gate the
// moment it can no longer be sure it holds it.
//
// Two clocks are at work. Expiry is on the database clock, so skew between
// nodes never decides who holds the lease. The fence is on this node's
// monotonic clock and needs no I/O: past FenceTimeout since the last renewal
// it confirmed, the gate closes, which (FenceTimeout < TTL) happens before
// any other node may take the lease over, even when the database is
// unreachable and a renewal is stuck in flight.
type Lease struct {
	cfg LeaseConfig

	base time.Time // monotonic origin of the nanosecond fields below
	// clock, when set (tests), replaces time.Since(base): a freeze can
	// then be simulated without stopping the process.
	clock func() int64

	// sem is the maintenance lock: a renewal tick and a stepdown's release
	// write exclude each other, or a tick in flight could renew the lease a
	// stepdown is expiring and put this node back in charge.
	sem chan struct{}

	held         atomic.Bool  // the gate
	lastOK       atomic.Int64 // when the last confirmed renewal was SENT
	noClaimUntil atomic.Int64 // claim pause after a stepdown
	owed         atomic.Bool  // a release write that did not return

	// Only the goroutine holding sem touches these.
	gapSince int64 // first failed renewal while holding, or 0
	failing  bool  // a failure was logged and no success since
}

func (l *Lease) mono() int64 {
	if l.clock != nil {
		return l.clock()
	}
	return int64(time.Since(l.base))
}

// Serving reports whether this node may act as the holder right now. It
// checks the renewal's age itself rather than trusting the watchdog to have
// run, so a process resuming from a freeze answers false at once, before
// any of its goroutines had a chance to notice.
func (l *Lease) Serving() bool {
	return l.held.Load() && time.Duration(l.mono()-l.lastOK.Load()) <= l.cfg.FenceTimeout
}

// Owner is the node id the lease is held under.
func (l *Lease) Owner() string { return l.cfg.NodeID }

// Run renews (or tries to acquire) the lease every heartbeat and runs the
// fence watchdog, until ctx ends. The first attempt is made at once.
func (l *Lease) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.watchdog(ctx)
	}()
	tick.Now(ctx, l.cfg.Heartbeat, l.Tick)
	<-done
}

// fenceTick is how often the watchdog looks: small against the fence
// timeout, so the gate closes well before the lease can expire.
func (l *Lease) fenceTick() time.Duration {
	return min(max(l.cfg.FenceTimeout/10, 5*time.Millisecond), 250*time.Millisecond)
}

// watchdog closes the gate when no renewal was confirmed within
// FenceTimeout. It never touches the database, so a hung connection cannot
// keep it from fencing.
func (l *Lease) watchdog(ctx context.Context) {
	tick.Every(ctx, l.fenceTick(), l.fenceIfStale)
}

// fenceIfStale closes the gate of a holder whose last confirmed renewal is
// older than FenceTimeout.
func (l *Lease) fenceIfStale(ctx context.Context) {
	if !l.held.Load() {
		return
	}
	since := time.Duration(l.mono() - l.lastOK.Load())
	if since > l.cfg.FenceTimeout && l.held.CompareAndSwap(true, false) {
		l.cfg.Logger.WarnContext(ctx, "listener lease fenced",
			"since_last_renewal", since.Round(time.Millisecond), "fence_timeout", l.cfg.FenceTimeout, "lease_ttl", l.cfg.TTL)
		l.cfg.Changed()
	}
}

// lock takes the maintenance lock, waiting at most bound (0: until ctx ends).
func (l *Lease) lock(ctx context.Context, bound time.Duration) bool {
	var timeout <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case l.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-timeout:
		return false
	}
}

func (l *Lease) unlock() { <-l.sem }

// Tick makes one acquire-or-renew attempt. Run calls it every heartbeat;
// tests call it to step the lease by hand.
func (l *Lease) Tick(ctx context.Context) {
	if !l.lock(ctx, 0) {
		return
	}
	defer l.unlock()
	if l.mono() < l.noClaimUntil.Load() {
		// A stepdown released the lease but left this node as its owner, and
		// the renew branch of the claim does not look at expiry: claiming now
		// would take straight back what the stepdown just gave away.
		return
	}
	// Stamp the send time, not the answer's: the database computes the
	// expiry after the statement arrives, so the lease is valid for at least
	// TTL from here, and the fence must count from here too.
	sent := l.mono()
	cctx, cancel := context.WithTimeout(ctx, l.cfg.FenceTimeout)
	held, err := l.claim(cctx)
	cancel()
	if err == nil && time.Duration(l.mono()-sent) > l.cfg.FenceTimeout {
		// The answer came back later than the fence allows: a process
		// frozen with its claim in flight reads, on resuming, an answer
		// the database gave long ago, and must not take it as holding the
		// lease now (the timeout above cannot fire while the process is
		// stopped). Count it as a failed renewal; the next tick asks again.
		err = fmt.Errorf("claim lease %s: answer took %s, longer than fence_timeout %s", l.cfg.Key,
			time.Duration(l.mono()-sent).Round(time.Millisecond), l.cfg.FenceTimeout)
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if l.held.Load() && l.gapSince == 0 {
			l.gapSince = sent
		}
		if !l.failing {
			l.failing = true
			l.cfg.Logger.WarnContext(ctx, "listener lease renewal failed; will retry each heartbeat",
				"holding", l.held.Load(), "error", err)
		}
		return
	}
	l.failing = false
	if !held {
		l.gapSince = 0
		if l.held.CompareAndSwap(true, false) {
			l.cfg.Logger.WarnContext(ctx, "listener lease lost")
			l.cfg.Changed()
		}
		return
	}
	l.lastOK.Store(sent)
	switch {
	case l.held.CompareAndSwap(false, true):
		l.cfg.Logger.InfoContext(ctx, "listener lease acquired", "lease_ttl", l.cfg.TTL)
		l.cfg.Changed()
	case l.gapSince != 0:
		l.cfg.Logger.InfoContext(ctx, "listener lease renewed after gap",
			"gap", time.Duration(sent-l.gapSince).Round(time.Millisecond))
	}
	l.gapSince = 0
}

// claimSQL is the lease's upsert: $1 key, $2 node id, $3 TTL in
// microseconds, $4 this node's listener priority. It returns the owner when
// this node holds the lease after it, and no row when another node's lease
// is live, or a live node of a higher priority may take the expired lease
// first (see LeaseConfig.Priority; the lease's last owner does not count:
// it died, fenced itself or stepped down). A node of priority 0 never
// inserts or takes the lease.
const claimSQL = `
	INSERT INTO mefor_leader_lease AS l (key, owner, expires_at)
	SELECT $1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond' WHERE $4::int > 0
	ON CONFLICT (key) DO UPDATE SET
		owner = EXCLUDED.owner,
		expires_at = EXCLUDED.expires_at,
		released_at = NULL,
		acquired_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at >= clock_timestamp()
			THEN l.acquired_at ELSE clock_timestamp() END
	WHERE l.owner = $2 OR (l.expires_at < clock_timestamp() AND (
		l.expires_at < clock_timestamp() - $3::bigint * interval '1 microsecond'
		OR NOT EXISTS (
			SELECT 1 FROM mefor_node n
			WHERE n.listener_priority > $4::int AND n.id <> $2 AND n.id <> l.owner
			  AND n.status <> 'left' AND NOT ` + nodeStaleSQL + `)))
	RETURNING owner`

// claim acquires or renews the lease in one statement, on the database
// clock: insert it when absent; otherwise take it only if this node already
// owns it (renew) or it has expired (take over). Another node's live lease
// makes the update a no-op and no row comes back.
func (l *Lease) claim(ctx context.Context) (bool, error) {
	if m := l.cfg.Membership; m != nil {
		return l.claimAndBeat(ctx, m)
	}
	var owner string
	err := l.cfg.Pool.QueryRow(ctx, claimSQL, l.cfg.Key, l.cfg.NodeID, l.cfg.TTL.Microseconds(), l.cfg.Priority).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim lease %s: %w", l.cfg.Key, err)
	}
	return owner == l.cfg.NodeID, nil
}

// claimAndBeat is claim and the membership's heartbeat in one statement
// (one transaction): the same upsert of the lease, and the node's row
// refreshed with holds_lease saying whether that upsert left this node the
// owner. The beat is confirmed with the time it was sent, as a beat of its
// own would be. The renewal never waits for the node's row: when another
// writer holds it (the membership's own beat, a stepdown's), the beat is
// skipped, left unconfirmed, and the membership loop makes it.
func (l *Lease) claimAndBeat(ctx context.Context, m *Membership) (bool, error) {
	var owner *string
	var beats int64
	sent := m.stamp()
	err := l.cfg.Pool.QueryRow(ctx, `
		WITH claim AS (`+claimSQL+`
		), beat AS (
			UPDATE mefor_node SET last_seen = clock_timestamp(), status = 'active',
				holds_lease = EXISTS (SELECT 1 FROM claim WHERE owner = $2)
			WHERE id = (SELECT id FROM mefor_node WHERE id = $5 FOR UPDATE SKIP LOCKED)
			RETURNING id
		)
		SELECT (SELECT owner FROM claim), (SELECT count(*) FROM beat)`,
		l.cfg.Key, l.cfg.NodeID, l.cfg.TTL.Microseconds(), l.cfg.Priority, m.cfg.NodeID).Scan(&owner, &beats)
	if err != nil {
		return false, fmt.Errorf("claim lease %s and heartbeat: %w", l.cfg.Key, err)
	}
	if beats > 0 {
		m.confirmed(sent)
	}
	return owner != nil && *owner == l.cfg.NodeID, nil
}

// armPause stops this node from claiming for two heartbeats, long enough
// for a standby's tick to take the released lease.
func (l *Lease) armPause() {
	l.noClaimUntil.Store(l.mono() + int64(2*l.cfg.Heartbeat))
}

// StepdownResult is what a stepdown did, as it will be audited.
type StepdownResult struct {
	Outcome string
	// WasHolder: the node held the lease, or owed a release write, when the
	// request was acted on.
	WasHolder bool
	// ReleasedAt is the database time the release write landed; nil when it
	// did not (or there was nothing to release).
	ReleasedAt *time.Time
	// Reason explains a refusal, without message content.
	Reason string
}

// StepDown releases the lease so another node takes the listeners over, and
// keeps this node running as a standby.
//
// The order is what makes it safe. The maintenance lock comes first (bounded
// by FenceTimeout: past it this node's own watchdog has given up on the
// database, and a timeout refuses without touching anything). Then the gate
// closes, before any database write, so nothing here acts as holder while
// the release is in flight; then the claim pause is armed, so a request
// cancelled during the write still keeps this node from re-claiming; then
// the listeners drain and the release is written; then the pause is armed
// again, so a slow write has not used it up. A write that does not return is
// a refusal, never a success: the lease may still be live, and this node
// remembers it owes the write so a retry sends it again.
func (l *Lease) StepDown(ctx context.Context) StepdownResult {
	if !l.lock(ctx, l.cfg.FenceTimeout) {
		return StepdownResult{Outcome: OutcomeLockTimeout, WasHolder: l.held.Load(),
			Reason: fmt.Sprintf("the lease maintenance lock stayed busy for %s (fence_timeout); nothing was changed", l.cfg.FenceTimeout)}
	}
	defer l.unlock()
	wasHolder, owed := l.held.Load(), l.owed.Load()
	if !wasHolder && !owed {
		// A node that fenced itself (renewals too slow) has closed its gate,
		// but the lease row may still name it and be live: then it is still
		// the holder as far as the cluster can tell, and its next renewal
		// would take the gate back. Release that lease too.
		rctx, cancel := context.WithTimeout(ctx, l.cfg.FenceTimeout)
		holder, err := LeaseHolder(rctx, l.cfg.Pool, l.cfg.Key)
		cancel()
		if err != nil {
			return StepdownResult{Outcome: OutcomeLockTimeout, Reason: "could not read the lease: " + err.Error() + "; nothing was changed"}
		}
		if holder != l.cfg.NodeID {
			return StepdownResult{Outcome: OutcomeNotHolder, Reason: "this node does not hold the listener lease"}
		}
	}
	if l.held.CompareAndSwap(true, false) {
		l.cfg.Changed()
	}
	l.armPause()
	l.owed.Store(true)
	if wasHolder && l.cfg.Drain != nil {
		dctx, cancel := context.WithTimeout(ctx, l.cfg.FenceTimeout)
		l.cfg.Drain(dctx)
		cancel()
	}
	wctx, cancel := context.WithTimeout(ctx, l.cfg.FenceTimeout)
	releasedAt, err := l.release(wctx)
	cancel()
	if ctx.Err() != nil {
		// The request was cancelled mid-write: leave at once. The pause
		// armed before the write is what keeps this node from re-claiming.
		return StepdownResult{Outcome: OutcomeReleaseUnconfirmed, WasHolder: true,
			Reason: "the stepdown was cancelled before the release write returned"}
	}
	l.armPause()
	if err != nil {
		l.cfg.Logger.ErrorContext(ctx, "listener lease release not confirmed; this node stopped serving but the lease may still be live",
			"error", err)
		return StepdownResult{Outcome: OutcomeReleaseUnconfirmed, WasHolder: true,
			Reason: "the release write did not return: " + err.Error()}
	}
	l.owed.Store(false)
	l.cfg.Logger.InfoContext(ctx, "listener lease released", "reason", "stepdown")
	return StepdownResult{Outcome: OutcomeReleased, WasHolder: true, ReleasedAt: releasedAt}
}

// release expires the lease row if this node still owns it. It returns the
// database time of the write, or nil when the lease had already passed to
// another node (nothing left to release).
func (l *Lease) release(ctx context.Context) (*time.Time, error) {
	var at time.Time
	err := l.cfg.Pool.QueryRow(ctx, `
		UPDATE mefor_leader_lease SET expires_at = clock_timestamp(), released_at = clock_timestamp()
		WHERE key = $1 AND owner = $2
		RETURNING clock_timestamp()`, l.cfg.Key, l.cfg.NodeID).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("release lease %s: %w", l.cfg.Key, err)
	}
	return &at, nil
}

// Release gives the lease up on a clean stop, best effort: the caller has
// stopped Run, so nothing can re-claim it, and a release that fails only
// means the standby waits out the TTL.
func (l *Lease) Release(ctx context.Context) {
	was := l.held.Swap(false)
	if was {
		l.cfg.Changed()
	}
	if !was && !l.owed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.FenceTimeout)
	defer cancel()
	if _, err := l.release(ctx); err != nil {
		l.cfg.Logger.WarnContext(ctx, "could not release the listener lease; it expires on its own", "error", err)
		return
	}
	l.owed.Store(false)
	l.cfg.Logger.InfoContext(ctx, "listener lease released", "reason", "stop")
}

// LeaseHolder returns the node holding a live lease, or "" when none does.
func LeaseHolder(ctx context.Context, db DB, key string) (string, error) {
	var owner string
	err := db.QueryRow(ctx, `SELECT owner FROM mefor_leader_lease WHERE key = $1 AND expires_at > clock_timestamp()`, key).Scan(&owner)
	if err == pgx.ErrNoRows {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read lease %s: %w", key, err)
	}
	return owner, nil
}

// ErrNotLeaseHolder is returned by a batch carrying QueueLeaseCheck when the
// node no longer holds a live listener lease.
var ErrNotLeaseHolder = errors.New("this node no longer holds the listener lease")

// QueueLeaseCheck adds to b a check that owner holds a live listener lease,
// failing the batch with ErrNotLeaseHolder otherwise, so intake can refuse
// a message in the same round trip that stores it: a node that lost the
// lease (frozen, cut off) cannot store, and so never acknowledges, anything
// once another node may be listening. It takes no row lock: the lease
// cannot pass to another node before its expiry, which this reads.
//
// The check raises an error in the database (a division by the number of
// matching lease rows) rather than only in Go, so it also refuses in a
// batch sent outside a transaction block, which PostgreSQL commits at the
// batch's end unless a statement failed.
func QueueLeaseCheck(b *pgx.Batch, owner string) {
	b.Queue(`SELECT 1 / count(*) FROM mefor_leader_lease WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()`,
		ListenerLeaseKey, owner).QueryRow(func(r pgx.Row) error {
		var one int64
		err := r.Scan(&one)
		if isLeaseCheckRefusal(err) {
			return ErrNotLeaseHolder
		}
		return err
	})
}

// isLeaseCheckRefusal reports whether err is QueueLeaseCheck's statement
// refusing: with no live lease row for the owner it divides by zero, which
// raises division_by_zero (22012).
func isLeaseCheckRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22012"
}
