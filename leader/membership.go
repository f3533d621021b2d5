package leader

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/tick"
)

// MembershipConfig configures a Membership.
type MembershipConfig struct {
	Pool      *pgxpool.Pool
	NodeID    string
	Heartbeat time.Duration
	// NodeTimeout is how long the node may stay silent before the others
	// count it as dead and hand its lanes on. It is recorded on the row, so
	// every reader judges the node by it (nodeDeadSQL).
	NodeTimeout time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
	// HoldsLease, when set, is folded into every heartbeat so the listing
	// shows which node serves the listeners; nil records false.
	HoldsLease func() bool
	// ListenerPriority and NeverListens are recorded on the node's row
	// when it joins (as EffectivePriority), where the other nodes' lease
	// claims read them: give the same as the node's LeaseConfig. The
	// priority defaults to 1.
	ListenerPriority int
	NeverListens     bool
}

// checkNode refuses what every node loop of this package needs and lacks: a
// pool, a node id, a positive heartbeat. what names the loop in the error.
func checkNode(what string, pool *pgxpool.Pool, nodeID string, heartbeat time.Duration) error {
	switch {
	case pool == nil:
		return fmt.Errorf("%s: no database pool", what)
	case nodeID == "":
		return fmt.Errorf("%s: no node id", what)
	case heartbeat <= 0:
		return fmt.Errorf("%s: heartbeat must be positive, got %s", what, heartbeat)
	}
	return nil
}

// NewMembership returns a membership, or an error when the heartbeat does
// not fit well within the node timeout: a node must be able to miss a
// heartbeat and still know, by Fresh(NodeTimeout - Heartbeat), that the
// others have not counted it dead.
func NewMembership(cfg MembershipConfig) (*Membership, error) {
	if err := checkNode("membership", cfg.Pool, cfg.NodeID, cfg.Heartbeat); err != nil {
		return nil, err
	}
	if cfg.NodeTimeout <= 2*cfg.Heartbeat {
		return nil, fmt.Errorf("membership: node timeout (%s) must be longer than two heartbeats (%s each)", cfg.NodeTimeout, cfg.Heartbeat)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Membership{cfg: cfg}, nil
}

// Membership keeps this node's mefor_node row fresh.
type Membership struct {
	cfg MembershipConfig

	// lastOK is when the last confirmed heartbeat was sent, in nanoseconds
	// of the monotonic clock since base.
	base   time.Time
	lastOK atomic.Int64
	// joined is set once base is, so readers on other goroutines (a
	// metrics scrape may come before Join) never read base half-written.
	joined atomic.Bool
}

func (m *Membership) mono() int64 {
	if m.base.IsZero() {
		return 0
	}
	return int64(time.Since(m.base))
}

// Fresh reports whether this node's last confirmed heartbeat was sent within
// d. The rest of the cluster treats a node silent for node_timeout as dead
// and hands its drainers on; a drainer checks Fresh(node_timeout -
// heartbeat) before each send, so a node resuming from a freeze does not
// send what a replacement may already have sent.
func (m *Membership) Fresh(d time.Duration) bool {
	return !m.base.IsZero() && time.Duration(m.mono()-m.lastOK.Load()) <= d
}

// HeartbeatAge is the time since this node's last confirmed heartbeat was
// sent, by the monotonic clock; false before Join.
func (m *Membership) HeartbeatAge() (time.Duration, bool) {
	if !m.joined.Load() {
		return 0, false
	}
	return time.Duration(m.mono() - m.lastOK.Load()), true
}

// Join registers the node (or re-registers a restarted one with the same id).
func (m *Membership) Join(ctx context.Context) error {
	host, _ := os.Hostname()
	if m.base.IsZero() {
		m.base = time.Now()
	}
	sent := m.mono()
	_, err := m.cfg.Pool.Exec(ctx, `
		INSERT INTO mefor_node (id, host, pid, heartbeat_ms, node_timeout_ms, listener_priority) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
			started_at = clock_timestamp(), last_seen = clock_timestamp(), status = 'active', holds_lease = false,
			heartbeat_ms = EXCLUDED.heartbeat_ms, node_timeout_ms = EXCLUDED.node_timeout_ms,
			listener_priority = EXCLUDED.listener_priority`,
		m.cfg.NodeID, host, os.Getpid(), m.cfg.Heartbeat.Milliseconds(), m.cfg.NodeTimeout.Milliseconds(),
		EffectivePriority(m.cfg.ListenerPriority, m.cfg.NeverListens))
	if err != nil {
		return fmt.Errorf("register node %s: %w", m.cfg.NodeID, err)
	}
	m.lastOK.Store(sent)
	m.joined.Store(true)
	return nil
}

// Beat refreshes the row once, e.g. right after the lease changed hands.
func (m *Membership) Beat(ctx context.Context) error { return m.beat(ctx) }

// Run heartbeats until ctx ends. A failed beat is logged and retried at the
// next tick: the node keeps working, and if it stays silent past
// node_timeout the cluster reclaims its drainers, which fencing makes safe.
//
// A lease built with this membership (LeaseConfig.Membership) refreshes the
// row in its renewal statement; Run then writes only when no beat was
// confirmed within the last heartbeat (the lease paused after a stepdown,
// its maintenance lock held, its statement failing), so an idle node pays
// one write a heartbeat for both.
func (m *Membership) Run(ctx context.Context) {
	tick.Every(ctx, m.cfg.Heartbeat, func(ctx context.Context) { m.tick(ctx) })
}

// tick beats unless a beat was confirmed within the last heartbeat, and
// reports whether it wrote.
func (m *Membership) tick(ctx context.Context) bool {
	if m.Fresh(m.cfg.Heartbeat) {
		return false
	}
	if err := m.beat(ctx); err != nil && ctx.Err() == nil {
		m.cfg.Logger.WarnContext(ctx, "heartbeat failed", "error", err)
	}
	return true
}

func (m *Membership) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	holds := m.cfg.HoldsLease != nil && m.cfg.HoldsLease()
	sent := m.mono()
	_, err := m.cfg.Pool.Exec(ctx, `UPDATE mefor_node SET last_seen = clock_timestamp(), status = 'active', holds_lease = $2 WHERE id = $1`,
		m.cfg.NodeID, holds)
	if err == nil {
		m.lastOK.Store(sent)
	}
	return err
}

// stamp is the time a beat folded into another statement is sent, for
// confirmed.
func (m *Membership) stamp() int64 { return m.mono() }

// confirmed records a beat sent at sent (a stamp) as confirmed by the
// database.
func (m *Membership) confirmed(sent int64) {
	if m.joined.Load() {
		m.lastOK.Store(sent)
	}
}

// Leave marks the node as having left cleanly.
func (m *Membership) Leave(ctx context.Context) error {
	_, err := m.cfg.Pool.Exec(ctx, `UPDATE mefor_node SET status = 'left', holds_lease = false, last_seen = clock_timestamp() WHERE id = $1`, m.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("mark node %s left: %w", m.cfg.NodeID, err)
	}
	return nil
}
