package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// DB is what the table functions need: a pool, a connection or a
// transaction.
type DB = dbpool.DBTX

// What a node's row says about it, judged on the database clock against the
// timings the node itself recorded (Membership.Join), so every reader
// agrees without the config file. These two fragments are the only
// definitions; every query on mefor_node that tells nodes apart uses them,
// on a row aliased n.
const (
	// nodeStaleSQL: a node that has not left but missed more than two of
	// its heartbeats. It is shown as stale; the cluster does not act on it.
	nodeStaleSQL = `(n.status <> 'left' AND n.last_seen < clock_timestamp() - 3 * n.heartbeat_ms * interval '1 millisecond')`
	// nodeDeadSQL: a node that left, or that has been silent for longer
	// than its node_timeout. The cluster hands its lanes on and ends its
	// database sessions; it is not counted among the live nodes.
	nodeDeadSQL = `(n.status = 'left' OR n.last_seen < clock_timestamp() - n.node_timeout_ms * interval '1 millisecond')`
)

// Node is one row of the cluster's node listing.
type Node struct {
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// LastSeenAgo is seconds since the last heartbeat, by the database clock.
	LastSeenAgo float64 `json:"last_seen_seconds_ago"`
	// Status is active, stale (missed more than two of its heartbeats; see
	// nodeStaleSQL) or left (stopped cleanly).
	Status string `json:"status"`
	// HoldsLease marks the node serving the inbound listeners. At most one
	// node carries it: of the live nodes whose heartbeat says they hold the
	// lease, the one seen last, so a crashed holder's stale flag never shows
	// a second holder next to the new one.
	HoldsLease  bool `json:"holds_lease"`
	RiverLeader bool `json:"river_leader"`
	// ListenerPriority is the node's rank for the listener lease
	// (cluster.listener_priority); 0 never takes it.
	ListenerPriority int `json:"listener_priority"`
}

// Node statuses.
const (
	NodeActive = "active"
	NodeStale  = "stale"
	NodeLeft   = "left"
)

// ListNodes returns every node that ever joined, by id.
func ListNodes(ctx context.Context, q DB) ([]Node, error) {
	nodes, err := dbpool.Rows(ctx, q, "list nodes", func(r pgx.CollectableRow) (Node, error) {
		var n Node
		err := r.Scan(&n.ID, &n.Host, &n.PID, &n.StartedAt, &n.LastSeen, &n.LastSeenAgo, &n.Status, &n.HoldsLease, &n.RiverLeader, &n.ListenerPriority)
		return n, err
	}, `
		SELECT n.id, n.host, n.pid, n.started_at, n.last_seen,
			extract(epoch FROM clock_timestamp() - n.last_seen)::float8,
			CASE WHEN n.status = 'left' THEN 'left' WHEN `+nodeStaleSQL+` THEN 'stale' ELSE 'active' END,
			n.holds_lease,
			EXISTS (SELECT 1 FROM river_leader l WHERE l.leader_id = n.id AND l.expires_at > now()),
			n.listener_priority
		FROM mefor_node n ORDER BY n.id`)
	if err != nil {
		return nil, err
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
	// ListenerCandidates counts the active nodes that may take the
	// listener lease (listener_priority above 0). With none, no node binds
	// the listeners, however many run.
	ListenerCandidates int `json:"listener_candidates"`
}

// ReadClusterStatus reads the lease, River's leader and the node counts.
func ReadClusterStatus(ctx context.Context, tx DB) (ClusterStatus, error) {
	var st ClusterStatus
	err := func() error {
		var owner string
		var expires *time.Time
		var live bool
		// A released lease reads -infinity (which time.Time cannot hold):
		// show no expiry for it.
		err := tx.QueryRow(ctx, `
			SELECT owner, CASE WHEN expires_at = '-infinity' THEN NULL ELSE expires_at END, expires_at > clock_timestamp()
			FROM mefor_leader_lease WHERE key = $1`, ListenerLeaseKey).Scan(&owner, &expires, &live)
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
			SELECT count(*), count(*) FILTER (WHERE n.status <> 'left' AND NOT `+nodeStaleSQL+`),
				count(*) FILTER (WHERE n.status <> 'left' AND NOT `+nodeStaleSQL+` AND n.listener_priority > 0)
			FROM mefor_node n`).Scan(&st.Nodes, &st.ActiveNodes, &st.ListenerCandidates)
		if err != nil {
			return fmt.Errorf("count nodes: %w", err)
		}
		return nil
	}()
	return st, err
}

// DeadNodes returns the ids of the nodes that count as dead (nodeDeadSQL)
// and were not seen leaving: reclaim hands the lanes their drainers still
// hold to the other nodes.
func DeadNodes(ctx context.Context, q DB) ([]string, error) {
	return dbpool.Column[string](ctx, q, "list dead nodes", `SELECT n.id FROM mefor_node n WHERE `+nodeDeadSQL+` ORDER BY n.id`)
}

// LiveNodes returns the ids of the nodes that are not dead (nodeDeadSQL),
// for readers of per-node tables that show only what live nodes run.
func LiveNodes(ctx context.Context, q DB) ([]string, error) {
	return dbpool.Column[string](ctx, q, "list live nodes", `SELECT n.id FROM mefor_node n WHERE NOT `+nodeDeadSQL+` ORDER BY n.id`)
}

// ApplicationNamePrefix starts the application_name of a node's database
// sessions; the node id follows.
const ApplicationNamePrefix = "mefor "

// ApplicationName is the application_name of a node's sessions, cut to the
// 63 bytes PostgreSQL keeps. A node names its sessions so the others can end
// them once it is dead (TerminateDeadNodeSessions).
func ApplicationName(nodeID string) string {
	name := ApplicationNamePrefix + nodeID
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// TerminateDeadNodeSessions ends the database sessions of dead nodes that
// did not leave cleanly, found by their application_name, and returns the
// ids of the nodes whose sessions it ended. A node frozen or cut off in the
// middle of a transaction keeps its session, and the lane locks it holds,
// for as long as TCP does: idle_in_transaction_session_timeout ends most of
// them, but not one stopped half-way through a pipelined batch (the server
// then waits for the rest of it, "active"). The cluster already counts such
// a node as dead and has handed its drainers on; ending its sessions frees
// its locks, and fencing keeps it from acting if it comes back.
func TerminateDeadNodeSessions(ctx context.Context, q DB) ([]string, error) {
	return dbpool.Column[string](ctx, q, "end sessions of dead nodes", `
		WITH dead AS MATERIALIZED (
			-- Materialized so the filter is complete before any session is
			-- ended: the planner may otherwise evaluate the call first.
			SELECT a.pid, n.id FROM pg_stat_activity a
			JOIN mefor_node n ON a.application_name = left($1 || n.id, 63)
			WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
			  AND n.status = 'active' AND `+nodeDeadSQL+`)
		SELECT id FROM dead WHERE pg_terminate_backend(pid)`, ApplicationNamePrefix)
}
