package nodeinfo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/leader"
)

// RecordEncryption notes which key node seals with (none: encryption off)
// and which key ids it can open, for `mefor status`. Key material never
// reaches the database.
func RecordEncryption(ctx context.Context, q pipeline.DBTX, nodeID string, kr *crypt.Keyring) error {
	ids := kr.IDs()
	if ids == nil {
		ids = []string{}
	}
	_, err := q.Exec(ctx, `
		INSERT INTO mefor_node_encryption (node_id, active_key, key_ids) VALUES ($1, NULLIF($2, ''), $3)
		ON CONFLICT (node_id) DO UPDATE SET active_key = EXCLUDED.active_key, key_ids = EXCLUDED.key_ids,
			recorded_at = clock_timestamp()`, nodeID, kr.ActiveID(), ids)
	if err != nil {
		return fmt.Errorf("record the encryption of node %s: %w", nodeID, err)
	}
	return nil
}

// NodeEncryption is what one live node seals with.
type NodeEncryption struct {
	Node string `json:"node"`
	// ActiveKey is "" when the node stores content in clear.
	ActiveKey string   `json:"active_key,omitempty"`
	KeyIDs    []string `json:"key_ids"`
}

// EncryptionStatus is the cluster's encryption at rest, as `mefor status`
// shows it.
type EncryptionStatus struct {
	// Nodes are the live nodes that recorded their keys.
	Nodes []NodeEncryption `json:"nodes"`
	// SealedStore is whether the store refuses content not sealed to its
	// row (pipeline.SealedStore): false means plaintext is still accepted.
	SealedStore bool `json:"sealed_store"`
}

// State sums the nodes up: "on" (every node seals under one key), "off"
// (none seals), "mixed" (some do not, or under different keys), or ""
// when no live node recorded it.
func (s *EncryptionStatus) State() string {
	if s == nil || len(s.Nodes) == 0 {
		return ""
	}
	first := s.Nodes[0].ActiveKey
	for _, n := range s.Nodes[1:] {
		if n.ActiveKey != first {
			return "mixed"
		}
	}
	if first == "" {
		return "off"
	}
	return "on"
}

// ReadEncryptionStatus returns what each live node recorded.
func ReadEncryptionStatus(ctx context.Context, q pipeline.DBTX) (*EncryptionStatus, error) {
	live, err := leader.LiveNodes(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read encryption status: %w", err)
	}
	nodes, err := dbpool.Rows(ctx, q, "read encryption status", func(r pgx.CollectableRow) (NodeEncryption, error) {
		var n NodeEncryption
		err := r.Scan(&n.Node, &n.ActiveKey, &n.KeyIDs)
		return n, err
	}, `
		SELECT node_id, coalesce(active_key, ''), key_ids FROM mefor_node_encryption
		WHERE node_id = ANY($1) ORDER BY node_id`, live)
	if err != nil {
		return nil, err
	}
	if nodes == nil {
		nodes = []NodeEncryption{}
	}
	sealed, err := pipeline.SealedStore(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read encryption status: %w", err)
	}
	return &EncryptionStatus{Nodes: nodes, SealedStore: sealed}, nil
}
