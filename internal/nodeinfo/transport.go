// Package nodeinfo owns what each node records about itself beyond its
// membership: its listeners and certificates (mefor_node_transport), the
// keys it seals content with (mefor_node_encryption), its retention
// policy (mefor_node_retention) and where its config lets data go
// (mefor_node_egress).
package nodeinfo

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/pipeline"
)

// NodeCertificate is one certificate a node loaded from its files.
type NodeCertificate struct {
	File     string    `json:"file"`
	Subject  string    `json:"subject"`
	Issuer   string    `json:"issuer"`
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"not_after"`
	// WarnFrom is when the node starts warning about the expiry: NotAfter
	// less its tls_expiry_warning.
	WarnFrom time.Time `json:"warn_from"`
	Uses     []string  `json:"uses"`
}

// NodeListener is how one channel listens on a node.
type NodeListener struct {
	Channel string `json:"channel"`
	Listen  string `json:"listen"`
	TLS     bool   `json:"tls"`
	// ClientAuth: the listener requires a verified client certificate.
	ClientAuth bool `json:"client_auth"`
	// Exposed: the address is reachable from other machines (not
	// loopback).
	Exposed bool `json:"exposed"`
	// Acknowledged: the config says plaintext: true for this listener.
	Acknowledged bool `json:"acknowledged"`
}

// Flagged reports whether the listener, reachable from other machines,
// serves plaintext without the config saying it is meant to, or serves
// TLS to any client, without asking for a certificate.
func (l NodeListener) Flagged() bool {
	if !l.Exposed {
		return false
	}
	if l.TLS {
		return !l.ClientAuth
	}
	return !l.Acknowledged
}

// Transport is a node's transport security: its certificates and
// listeners.
type Transport struct {
	Certificates []NodeCertificate `json:"certificates"`
	Listeners    []NodeListener    `json:"listeners"`
}

// RecordTransport replaces what the node's row says about its transport
// security.
func RecordTransport(ctx context.Context, q pipeline.DBTX, nodeID string, t Transport) error {
	if t.Certificates == nil {
		t.Certificates = []NodeCertificate{}
	}
	if t.Listeners == nil {
		t.Listeners = []NodeListener{}
	}
	certs, err := json.Marshal(t.Certificates)
	if err != nil {
		return err
	}
	listeners, err := json.Marshal(t.Listeners)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, `
		INSERT INTO mefor_node_transport (node_id, certificates, listeners) VALUES ($1, $2, $3)
		ON CONFLICT (node_id) DO UPDATE SET certificates = EXCLUDED.certificates, listeners = EXCLUDED.listeners,
			recorded_at = clock_timestamp()`, nodeID, certs, listeners)
	if err != nil {
		return fmt.Errorf("record transport security of node %s: %w", nodeID, err)
	}
	return nil
}

// CertificateInUse is a certificate as `mefor status` lists it: the nodes
// that loaded it from the same path.
type CertificateInUse struct {
	NodeCertificate
	Nodes []string `json:"nodes"`
}

// ListenerInUse is a channel's listener on the nodes that listen alike.
type ListenerInUse struct {
	NodeListener
	Flagged bool     `json:"flagged"`
	Nodes   []string `json:"nodes"`
}

// TransportStatus is the transport security of the live nodes.
type TransportStatus struct {
	// Certificates is every certificate in use, soonest to expire first.
	Certificates []CertificateInUse `json:"certificates"`
	// Listeners is how each channel listens, by channel.
	Listeners []ListenerInUse `json:"listeners"`
}

// ReadTransportStatus merges what the live nodes recorded (leader.LiveNodes
// decides which nodes are live).
func ReadTransportStatus(ctx context.Context, q pipeline.DBTX) (*TransportStatus, error) {
	recs, err := readLive(ctx, q, "read transport security", `
		SELECT t.node_id, t.certificates, t.listeners
		FROM mefor_node_transport t
		WHERE t.node_id = ANY($1)
		ORDER BY t.node_id`, func(r pgx.CollectableRow) (string, Transport, error) {
		var node string
		var t Transport
		var certs, listeners []byte
		if err := r.Scan(&node, &certs, &listeners); err != nil {
			return node, t, err
		}
		return node, t, decodeJSON(node, jsonColumn{"certificates", certs, &t.Certificates}, jsonColumn{"listeners", listeners, &t.Listeners})
	})
	if err != nil {
		return nil, err
	}
	st := &TransportStatus{Certificates: []CertificateInUse{}, Listeners: []ListenerInUse{}}
	for _, rec := range recs {
		for _, c := range rec.v.Certificates {
			i := entryFor(&st.Certificates, func(o CertificateInUse) bool {
				return o.File == c.File && o.Serial == c.Serial && o.WarnFrom.Equal(c.WarnFrom) && slices.Equal(o.Uses, c.Uses)
			}, func() CertificateInUse { return CertificateInUse{NodeCertificate: c} })
			st.Certificates[i].Nodes = append(st.Certificates[i].Nodes, rec.node)
		}
		for _, l := range rec.v.Listeners {
			i := entryFor(&st.Listeners, func(o ListenerInUse) bool { return o.NodeListener == l },
				func() ListenerInUse { return ListenerInUse{NodeListener: l, Flagged: l.Flagged()} })
			st.Listeners[i].Nodes = append(st.Listeners[i].Nodes, rec.node)
		}
	}
	slices.SortStableFunc(st.Certificates, func(a, b CertificateInUse) int { return a.NotAfter.Compare(b.NotAfter) })
	slices.SortStableFunc(st.Listeners, func(a, b ListenerInUse) int { return strings.Compare(a.Channel, b.Channel) })
	return st, nil
}
