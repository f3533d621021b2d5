package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// NodeGauges reports this node's own state. Each field is read at scrape
// time; a nil field leaves its gauge out.
type NodeGauges struct {
	// HoldsLease reports whether this node holds the listener lease.
	HoldsLease func() bool
	// ConfigVersion is the cluster config version this node applied.
	ConfigVersion func() int64
	// HeartbeatAge is the time since this node's last confirmed
	// heartbeat, and false before the first one.
	HeartbeatAge func() (float64, bool)
	// CPUContended reports whether the host's CPUs are contended, as the
	// node's drainers see it (they gather only then).
	CPUContended func() bool
	// OpenConnections is how many connections each bound listener holds,
	// by channel.
	OpenConnections func() map[string]int
}

var (
	leaseHolderDesc = prometheus.NewDesc("mefor_lease_holder",
		"1 on the node holding the listener lease (it binds the inbound listeners), else 0.", nil, nil)
	configVersionDesc = prometheus.NewDesc("mefor_config_version",
		"The cluster config version this node applied (raised by each mefor reload).", nil, nil)
	heartbeatAgeDesc = prometheus.NewDesc("mefor_node_heartbeat_age_seconds",
		"Seconds since this node's last heartbeat the database confirmed.", nil, nil)
	openConnectionsDesc = prometheus.NewDesc("mefor_connections_open",
		"Connections this node's listener of a channel holds now (bounded by its max_connections); none while the node does not hold the listener lease.",
		[]string{"channel"}, nil)
	cpuContendedDesc = prometheus.NewDesc("mefor_cpu_contended",
		"1 while this node's host is short of CPU by its pressure stall information (drainers of dense lanes then gather rows before a hand-off), else 0; always 0 where /proc/pressure/cpu cannot be read.", nil, nil)
)

// Describe implements prometheus.Collector.
func (g *NodeGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- leaseHolderDesc
	ch <- configVersionDesc
	ch <- heartbeatAgeDesc
	ch <- cpuContendedDesc
	ch <- openConnectionsDesc
}

// Collect implements prometheus.Collector.
func (g *NodeGauges) Collect(ch chan<- prometheus.Metric) {
	if g.HoldsLease != nil {
		v := 0.0
		if g.HoldsLease() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(leaseHolderDesc, prometheus.GaugeValue, v)
	}
	if g.ConfigVersion != nil {
		ch <- prometheus.MustNewConstMetric(configVersionDesc, prometheus.GaugeValue, float64(g.ConfigVersion()))
	}
	if g.HeartbeatAge != nil {
		if age, ok := g.HeartbeatAge(); ok {
			ch <- prometheus.MustNewConstMetric(heartbeatAgeDesc, prometheus.GaugeValue, age)
		}
	}
	if g.CPUContended != nil {
		v := 0.0
		if g.CPUContended() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(cpuContendedDesc, prometheus.GaugeValue, v)
	}
	if g.OpenConnections != nil {
		for channel, n := range g.OpenConnections() {
			ch <- prometheus.MustNewConstMetric(openConnectionsDesc, prometheus.GaugeValue, float64(n), channel)
		}
	}
}
