// Package leader holds cluster membership: each node's heartbeat row, and
// (with the listener lease) which node binds the inbound listeners.
package leader

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Membership keeps this node's mefor_node row fresh.
type Membership struct {
	Pool      *pgxpool.Pool
	NodeID    string
	Heartbeat time.Duration
	// NodeTimeout is recorded on the row so `mefor nodes` can tell a stale
	// node without the config file.
	NodeTimeout time.Duration
	Logger      *slog.Logger
	// HoldsLease, when set, is folded into every heartbeat so the listing
	// shows which node serves the listeners; nil records false.
	HoldsLease func() bool

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
	_, err := m.Pool.Exec(ctx, `
		INSERT INTO mefor_node (id, host, pid, heartbeat_ms, node_timeout_ms) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
			started_at = clock_timestamp(), last_seen = clock_timestamp(), status = 'active', holds_lease = false,
			heartbeat_ms = EXCLUDED.heartbeat_ms, node_timeout_ms = EXCLUDED.node_timeout_ms`,
		m.NodeID, host, os.Getpid(), m.Heartbeat.Milliseconds(), m.NodeTimeout.Milliseconds())
	if err != nil {
		return fmt.Errorf("register node %s: %w", m.NodeID, err)
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
func (m *Membership) Run(ctx context.Context) {
	t := time.NewTicker(m.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.beat(ctx); err != nil && ctx.Err() == nil {
			m.Logger.WarnContext(ctx, "heartbeat failed", "error", err)
		}
	}
}

func (m *Membership) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.Heartbeat)
	defer cancel()
	holds := m.HoldsLease != nil && m.HoldsLease()
	sent := m.mono()
	_, err := m.Pool.Exec(ctx, `UPDATE mefor_node SET last_seen = clock_timestamp(), status = 'active', holds_lease = $2 WHERE id = $1`,
		m.NodeID, holds)
	if err == nil {
		m.lastOK.Store(sent)
	}
	return err
}

// Leave marks the node as having left cleanly.
func (m *Membership) Leave(ctx context.Context) error {
	_, err := m.Pool.Exec(ctx, `UPDATE mefor_node SET status = 'left', holds_lease = false, last_seen = clock_timestamp() WHERE id = $1`, m.NodeID)
	if err != nil {
		return fmt.Errorf("mark node %s left: %w", m.NodeID, err)
	}
	return nil
}
