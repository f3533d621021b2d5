package leader

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// The cluster config version (mefor_cluster_config) and what each node
// applied (columns of its mefor_node row).

// ConfigNotifyChannel is the LISTEN/NOTIFY channel a version bump is
// announced on, so nodes reload at once instead of at their next poll.
const ConfigNotifyChannel = "mefor_config"

// ClusterConfig is the cluster-wide config version: how many operator
// reloads there have been and which file the last one validated.
type ClusterConfig struct {
	Version int64 `json:"version"`
	// Hash is the SHA-256 of the file the last reload validated; empty
	// before the first reload.
	Hash     string     `json:"hash,omitempty"`
	BumpedBy string     `json:"bumped_by,omitempty"`
	BumpedAt *time.Time `json:"bumped_at,omitempty"`
}

// ReadClusterConfig returns the current cluster config version.
func ReadClusterConfig(ctx context.Context, q DB) (ClusterConfig, error) {
	var c ClusterConfig
	var hash, by *string
	err := q.QueryRow(ctx, `SELECT version, hash, bumped_by, bumped_at FROM mefor_cluster_config WHERE id`).
		Scan(&c.Version, &hash, &by, &c.BumpedAt)
	if err != nil {
		return c, fmt.Errorf("read cluster config version: %w", err)
	}
	c.Hash, c.BumpedBy = deref(hash), deref(by)
	return c, nil
}

// BumpClusterConfig increments the cluster config version, recording the
// hash of the validated file and who asked, and announces the new version
// on ConfigNotifyChannel (delivered when the surrounding transaction, if
// any, commits). It returns the new version.
func BumpClusterConfig(ctx context.Context, q DB, hash, by string) (int64, error) {
	var v int64
	err := q.QueryRow(ctx, `
		WITH bumped AS (
			UPDATE mefor_cluster_config
			SET version = version + 1, hash = $1, bumped_by = $2, bumped_at = clock_timestamp()
			WHERE id
			RETURNING version)
		SELECT version, pg_notify($3, version::text) FROM bumped`, hash, by, ConfigNotifyChannel).Scan(&v, nil)
	if err != nil {
		return 0, fmt.Errorf("bump cluster config version: %w", err)
	}
	return v, nil
}

// RecordConfigApplied notes on the node's row that it now runs the file
// with the given hash, at cluster config version, and clears any recorded
// reload failure.
func RecordConfigApplied(ctx context.Context, q DB, nodeID string, version int64, hash string) error {
	_, err := q.Exec(ctx, `
		UPDATE mefor_node SET config_version = $2, config_hash = $3, config_applied_at = clock_timestamp(),
			config_error = NULL, config_error_version = NULL, config_error_at = NULL
		WHERE id = $1`, nodeID, version, hash)
	if err != nil {
		return fmt.Errorf("record applied config on node %s: %w", nodeID, err)
	}
	return nil
}

// RecordConfigError notes on the node's row that reloading for cluster
// config version failed and why. The node keeps its applied version: it
// still runs the config it had. reason must not carry message content
// (config errors never do).
func RecordConfigError(ctx context.Context, q DB, nodeID string, version int64, reason string) error {
	_, err := q.Exec(ctx, `
		UPDATE mefor_node SET config_error = $3, config_error_version = $2, config_error_at = clock_timestamp()
		WHERE id = $1`, nodeID, version, reason)
	if err != nil {
		return fmt.Errorf("record config reload failure on node %s: %w", nodeID, err)
	}
	return nil
}

// NodeConfig is one node's applied config, as `mefor status` and
// `mefor reload --wait` show it.
type NodeConfig struct {
	Node string `json:"node"`
	// Live is false for a dead node: one that left or has been silent
	// for longer than its node_timeout.
	Live bool `json:"live"`
	// Version is the cluster config version the node last applied; nil
	// for a node that has not recorded one (started before this schema).
	Version   *int64     `json:"applied_version"`
	Hash      string     `json:"applied_hash,omitempty"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
	// Behind is true when the node has not applied the cluster's version.
	Behind bool `json:"behind"`
	// HashMismatch is true when the node runs a file whose hash differs
	// from the reference: the file of the last reload, or, before any
	// reload, the file most live nodes run.
	HashMismatch bool `json:"hash_mismatch"`
	// Error is the last failed reload (kept until one succeeds), with the
	// version it was for.
	Error        string     `json:"error,omitempty"`
	ErrorVersion *int64     `json:"error_version,omitempty"`
	ErrorAt      *time.Time `json:"error_at,omitempty"`
}

// ConfigStatus is the cluster config version and every known node's
// applied config.
type ConfigStatus struct {
	Cluster ClusterConfig `json:"cluster"`
	// ReferenceHash is what HashMismatch compares against.
	ReferenceHash string       `json:"reference_hash,omitempty"`
	Nodes         []NodeConfig `json:"nodes"`
}

// ReadConfigStatus returns the cluster config version and each node's
// applied config. Dead nodes (nodeDeadSQL) are listed as not live and never
// flagged.
func ReadConfigStatus(ctx context.Context, q DB) (*ConfigStatus, error) {
	cc, err := ReadClusterConfig(ctx, q)
	if err != nil {
		return nil, err
	}
	nodes, err := dbpool.Rows(ctx, q, "read node configs", func(r pgx.CollectableRow) (NodeConfig, error) {
		var n NodeConfig
		err := r.Scan(&n.Node, &n.Live, &n.Version, &n.Hash, &n.AppliedAt, &n.Error, &n.ErrorVersion, &n.ErrorAt)
		return n, err
	}, `
		SELECT n.id, NOT `+nodeDeadSQL+`,
			n.config_version, coalesce(n.config_hash, ''), n.config_applied_at,
			coalesce(n.config_error, ''), n.config_error_version, n.config_error_at
		FROM mefor_node n ORDER BY n.id`)
	if err != nil {
		return nil, err
	}
	st := &ConfigStatus{Cluster: cc, Nodes: nodes, ReferenceHash: cc.Hash}
	if st.ReferenceHash == "" {
		st.ReferenceHash = majorityHash(nodes)
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if !n.Live {
			continue
		}
		n.Behind = n.Version == nil || *n.Version < cc.Version
		n.HashMismatch = st.ReferenceHash != "" && n.Hash != "" && n.Hash != st.ReferenceHash
	}
	return st, nil
}

// majorityHash is the hash most live nodes run (ties broken by the smaller
// hash, so the answer is stable), or "" when no live node recorded one.
// Before the first reload there is no file to compare with, but two nodes
// started from different files are still worth flagging.
func majorityHash(nodes []NodeConfig) string {
	count := map[string]int{}
	best := ""
	for _, n := range nodes {
		if !n.Live || n.Hash == "" {
			continue
		}
		count[n.Hash]++
		if c := count[n.Hash]; best == "" || c > count[best] || (c == count[best] && n.Hash < best) {
			best = n.Hash
		}
	}
	return best
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ConfigAgreement says whether the cluster agrees on nodeID's config.
type ConfigAgreement struct {
	// Agreed is true when every live node, nodeID included, has applied
	// the cluster's config version and runs a file with nodeID's hash.
	Agreed bool
	// Reason says why not, naming a node, without message content.
	Reason string
}

// ReadConfigAgreement tells nodeID whether its config is the cluster's
// agreed one: the latest reload (or, before any, the file each node
// started with), applied by every live node, from the same file. Only
// then may nodeID treat what its file lacks as removed from the cluster's
// config: a node whose file differs, or that is ahead of or behind the
// others, may lack what they still serve. Dead nodes (nodeDeadSQL) are not
// asked.
func ReadConfigAgreement(ctx context.Context, q DB, nodeID string) (ConfigAgreement, error) {
	rows, err := q.Query(ctx, `
		SELECT n.id, coalesce(n.config_version, -1), coalesce(n.config_hash, ''), c.version
		FROM mefor_node n CROSS JOIN mefor_cluster_config c
		WHERE n.id = $1 OR NOT `+nodeDeadSQL+`
		ORDER BY n.id <> $1, n.id`, nodeID)
	if err != nil {
		return ConfigAgreement{}, fmt.Errorf("read the nodes' configs: %w", err)
	}
	type nodeCfg struct {
		id      string
		version int64
		hash    string
		cluster int64
	}
	nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodeCfg, error) {
		var n nodeCfg
		return n, r.Scan(&n.id, &n.version, &n.hash, &n.cluster)
	})
	if err != nil {
		return ConfigAgreement{}, fmt.Errorf("read the nodes' configs: %w", err)
	}
	if len(nodes) == 0 || nodes[0].id != nodeID {
		return ConfigAgreement{Reason: "this node has not recorded its config yet"}, nil
	}
	me := nodes[0]
	if me.version != me.cluster {
		return ConfigAgreement{Reason: fmt.Sprintf("this node runs config version %d, the cluster is at %d", me.version, me.cluster)}, nil
	}
	for _, n := range nodes[1:] {
		switch {
		case n.version != me.version:
			return ConfigAgreement{Reason: fmt.Sprintf("node %s runs config version %d, this node %d", n.id, n.version, me.version)}, nil
		case n.hash != me.hash:
			return ConfigAgreement{Reason: fmt.Sprintf("node %s runs another file (hash %s, this node %s)", n.id, short(n.hash), short(me.hash))}, nil
		}
	}
	return ConfigAgreement{Agreed: true}, nil
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
