package nodeinfo

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
)

// NodeEgress is where a node's config lets data go (mefor_node_egress).
type NodeEgress struct {
	// Restricted: the config has an egress: section; Allow is its list.
	Restricted bool     `json:"restricted"`
	Allow      []string `json:"allow"`
	// Plaintext are the outbound connections to other machines without
	// TLS that the config does not acknowledge with plaintext: true.
	Plaintext []PlaintextOutbound `json:"plaintext"`
}

// PlaintextOutbound is one connection in plaintext to another machine.
type PlaintextOutbound struct {
	// Target is destination:NAME, reference_set:NAME or alert_sink:NAME.
	Target string `json:"target"`
	// Address is host:port, never a URL's path or query.
	Address string `json:"address"`
	// Protocol is mllp or http.
	Protocol string `json:"protocol"`
}

// RecordEgress replaces what the node's row says about its egress.
func RecordEgress(ctx context.Context, q pipeline.DBTX, nodeID string, e NodeEgress) error {
	if e.Allow == nil {
		e.Allow = []string{}
	}
	if e.Plaintext == nil {
		e.Plaintext = []PlaintextOutbound{}
	}
	allow, err := json.Marshal(e.Allow)
	if err != nil {
		return err
	}
	plaintext, err := json.Marshal(e.Plaintext)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, `
		INSERT INTO mefor_node_egress (node_id, restricted, allow, plaintext) VALUES ($1, $2, $3, $4)
		ON CONFLICT (node_id) DO UPDATE SET restricted = EXCLUDED.restricted, allow = EXCLUDED.allow,
			plaintext = EXCLUDED.plaintext, recorded_at = clock_timestamp()`, nodeID, e.Restricted, allow, plaintext)
	if err != nil {
		return fmt.Errorf("record the egress of node %s: %w", nodeID, err)
	}
	return nil
}

// EgressInUse is an egress the live nodes listed in Nodes recorded alike.
type EgressInUse struct {
	NodeEgress
	Nodes []string `json:"nodes"`
}

// EgressStatus is where the live nodes let data go: one entry when they
// agree, none when no live node recorded it.
type EgressStatus struct {
	Policies []EgressInUse `json:"policies"`
}

// ReadEgressStatus merges what the live nodes recorded.
func ReadEgressStatus(ctx context.Context, q pipeline.DBTX) (*EgressStatus, error) {
	recs, err := readLive(ctx, q, "read egress status", `
		SELECT node_id, restricted, allow, plaintext FROM mefor_node_egress
		WHERE node_id = ANY($1) ORDER BY node_id`, func(r pgx.CollectableRow) (string, NodeEgress, error) {
		var node string
		var e NodeEgress
		var allow, plaintext []byte
		if err := r.Scan(&node, &e.Restricted, &allow, &plaintext); err != nil {
			return node, e, err
		}
		return node, e, decodeJSON(node, jsonColumn{"egress", allow, &e.Allow}, jsonColumn{"egress", plaintext, &e.Plaintext})
	})
	if err != nil {
		return nil, err
	}
	st := &EgressStatus{Policies: []EgressInUse{}}
	for _, rec := range recs {
		i := entryFor(&st.Policies, func(p EgressInUse) bool {
			return p.Restricted == rec.v.Restricted && slices.Equal(p.Allow, rec.v.Allow) && slices.Equal(p.Plaintext, rec.v.Plaintext)
		}, func() EgressInUse { return EgressInUse{NodeEgress: rec.v} })
		st.Policies[i].Nodes = append(st.Policies[i].Nodes, rec.node)
	}
	return st, nil
}
