package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenerLeaseKey is leader.ListenerLeaseKey (store cannot import leader).
const listenerLeaseKey = "listeners"

// Node is one row of the cluster's node listing.
type Node struct {
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// LastSeenAgo is seconds since the last heartbeat, by the database clock.
	LastSeenAgo float64 `json:"last_seen_seconds_ago"`
	// Status is active, stale (missed more than two heartbeats) or left
	// (stopped cleanly).
	Status string `json:"status"`
	// HoldsLease marks the node serving the inbound listeners. At most one
	// node carries it: of the live nodes whose heartbeat says they hold the
	// lease, the one seen last, so a crashed holder's stale flag never shows
	// a second holder next to the new one.
	HoldsLease  bool `json:"holds_lease"`
	RiverLeader bool `json:"river_leader"`
}

// Node statuses.
const (
	NodeActive = "active"
	NodeStale  = "stale"
	NodeLeft   = "left"
)

// ListNodes returns every node that ever joined, by id.
func ListNodes(ctx context.Context, q DBTX) ([]Node, error) {
	rows, err := q.Query(ctx, `
		SELECT n.id, n.host, n.pid, n.started_at, n.last_seen,
			extract(epoch FROM clock_timestamp() - n.last_seen)::float8,
			CASE WHEN n.status = 'left' THEN 'left'
				WHEN n.last_seen < clock_timestamp() - 3 * n.heartbeat_ms * interval '1 millisecond' THEN 'stale'
				ELSE 'active' END,
			n.holds_lease,
			EXISTS (SELECT 1 FROM river_leader l WHERE l.leader_id = n.id AND l.expires_at > now())
		FROM mefor_node n ORDER BY n.id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Node, error) {
		var n Node
		err := r.Scan(&n.ID, &n.Host, &n.PID, &n.StartedAt, &n.LastSeen, &n.LastSeenAgo, &n.Status, &n.HoldsLease, &n.RiverLeader)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	holder := -1
	for i, n := range nodes {
		if n.HoldsLease && n.Status == NodeActive && (holder < 0 || n.LastSeen.After(nodes[holder].LastSeen)) {
			holder = i
		}
	}
	for i := range nodes {
		nodes[i].HoldsLease = i == holder
	}
	return nodes, nil
}

// ClusterStatus is the cluster part of `mefor status` and /cluster/status.
type ClusterStatus struct {
	// LeaseHolder is the node the lease row names while it is live; "" when
	// no node holds it (none started, or it expired).
	LeaseHolder string `json:"lease_holder"`
	// LeaseExpiresAt is the lease row's expiry, live or not; nil before any
	// node ever took it.
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	RiverLeader    string     `json:"river_leader"`
	Nodes          int        `json:"nodes"`
	ActiveNodes    int        `json:"active_nodes"`
}

// ReadClusterStatus reads the lease, River's leader and the node counts.
func ReadClusterStatus(ctx context.Context, tx DBTX) (ClusterStatus, error) {
	var st ClusterStatus
	err := func() error {
		var owner string
		var expires *time.Time
		var live bool
		// A released lease reads -infinity (which time.Time cannot hold):
		// show no expiry for it.
		err := tx.QueryRow(ctx, `
			SELECT owner, CASE WHEN expires_at = '-infinity' THEN NULL ELSE expires_at END, expires_at > clock_timestamp()
			FROM mefor_leader_lease WHERE key = $1`, listenerLeaseKey).Scan(&owner, &expires, &live)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("read lease: %w", err)
		default:
			if live {
				st.LeaseHolder = owner
			}
			st.LeaseExpiresAt = expires
		}
		err = tx.QueryRow(ctx, `SELECT leader_id FROM river_leader WHERE expires_at > now() LIMIT 1`).Scan(&st.RiverLeader)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read River leader: %w", err)
		}
		err = tx.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE status = 'active'
				AND last_seen >= clock_timestamp() - 3 * heartbeat_ms * interval '1 millisecond')
			FROM mefor_node`).Scan(&st.Nodes, &st.ActiveNodes)
		if err != nil {
			return fmt.Errorf("count nodes: %w", err)
		}
		return nil
	}()
	return st, err
}
