package engine

import (
	"net/http"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/metrics"
)

// newMetrics builds the node's metrics: its own registry with the cluster
// gauges (read from the database at scrape time) and the node's gauges.
// The gauges read the node's lease, membership and applied config version,
// which New sets up later; they are only called once a scrape comes. The
// CPU gauge is taken as it is now, so New sets n.contended first.
func newMetrics(n *Node) *metrics.Metrics {
	return metrics.New(metrics.Options{
		Logger:  n.logger,
		Cluster: &metrics.ClusterCollector{Pool: n.opts.Pool, NodeID: n.opts.NodeID, CacheTTL: n.opts.MetricsCacheTTL},
		Node: &metrics.NodeGauges{
			HoldsLease:    func() bool { return n.lease.Serving() },
			ConfigVersion: n.AppliedConfigVersion,
			HeartbeatAge: func() (float64, bool) {
				age, ok := n.membership.HeartbeatAge()
				return age.Seconds(), ok
			},
			CPUContended:    n.contended,
			OpenConnections: n.openConnections,
		},
	})
}

// openConnections is how many connections each bound listener holds.
func (n *Node) openConnections() map[string]int {
	gates := n.gates.Load()
	if gates == nil {
		return nil
	}
	out := make(map[string]int, len(*gates))
	for ch, g := range *gates {
		out[ch] = g.Open()
	}
	return out
}

// publishGatesLocked makes the bound listeners' gates what the gauge
// reads. Callers hold n.mu.
func (n *Node) publishGatesLocked() {
	gates := make(map[string]*admission.Gate, len(n.listeners))
	for _, bl := range n.listeners {
		gates[bl.channel] = bl.gate
	}
	n.gates.Store(&gates)
}

// Metrics is the node's metrics registry.
func (n *Node) Metrics() *metrics.Metrics { return n.metrics }

// MetricsHandler serves the node's metrics in the Prometheus text format,
// for GET /metrics on the admin listener.
func (n *Node) MetricsHandler() http.Handler { return n.metrics.Handler() }
