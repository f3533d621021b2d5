package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
)

// ClusterCollector reports the gauges that describe the whole cluster,
// read from the database when Prometheus scrapes and kept for CacheTTL, so
// several scrapers (or a dashboard refreshing fast) cost one read. The read
// goes through the partial index on pending rows: its cost follows the
// backlog, never the history kept.
type ClusterCollector struct {
	Pool *pgxpool.Pool
	// NodeID is this node's River client id, for mefor_river_leader.
	NodeID string
	// CacheTTL is how long one read serves scrapes. Defaults to 5s.
	CacheTTL time.Duration
	// Timeout bounds one read. Defaults to 3s.
	Timeout time.Duration
	Logger  *slog.Logger

	mu     sync.Mutex
	at     time.Time
	cached *clusterRead
	failed bool // the last read failed (logged once per failure streak)
}

// clusterRead is one read of the cluster gauges.
type clusterRead struct {
	backlog *search.Backlog
	lags    []auditforward.Lag
}

var (
	queueDepthDesc = prometheus.NewDesc("mefor_queue_depth",
		"Deliveries queued for a destination, in flight included, across the cluster.", []string{"destination"}, nil)
	queueOldestDesc = prometheus.NewDesc("mefor_queue_oldest_age_seconds",
		"Age of the oldest delivery queued for a destination, across the cluster; 0 when none is queued.", []string{"destination"}, nil)
	stageBacklogDesc = prometheus.NewDesc("mefor_stage_backlog",
		"Pending rows of a stage (ingress, routed, outbound) for a channel, across the cluster.", []string{"stage", "channel"}, nil)
	riverLeaderDesc = prometheus.NewDesc("mefor_river_leader",
		"1 on the node that is River's elected leader (it schedules maintenance and alert jobs), else 0.", nil, nil)
	auditForwardLagDesc = prometheus.NewDesc("mefor_audit_forward_lag_rows",
		"Audit rows an audit.forward target (syslog, webhook) has not yet had accepted by its receiver, across the cluster.", []string{"target"}, nil)
	auditForwardOldestDesc = prometheus.NewDesc("mefor_audit_forward_oldest_age_seconds",
		"Age of the oldest audit row an audit.forward target has not yet had accepted; 0 when it has them all.", []string{"target"}, nil)
	clusterUpDesc = prometheus.NewDesc("mefor_cluster_gauges_up",
		"1 when the last database read for the cluster gauges succeeded, else 0 (and the cluster gauges are absent).", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *ClusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{queueDepthDesc, queueOldestDesc, stageBacklogDesc, riverLeaderDesc, clusterUpDesc,
		auditForwardLagDesc, auditForwardOldestDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ClusterCollector) Collect(ch chan<- prometheus.Metric) {
	r, err := c.read()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(clusterUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(clusterUpDesc, prometheus.GaugeValue, 1)
	for _, l := range r.lags {
		ch <- prometheus.MustNewConstMetric(auditForwardLagDesc, prometheus.GaugeValue, float64(l.Rows), l.Target)
		ch <- prometheus.MustNewConstMetric(auditForwardOldestDesc, prometheus.GaugeValue, l.OldestSeconds, l.Target)
	}
	b := r.backlog
	leader := 0.0
	if b.RiverLeader != "" && b.RiverLeader == c.NodeID {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(riverLeaderDesc, prometheus.GaugeValue, leader)

	type queue struct {
		depth  int64
		oldest float64
	}
	queues := map[string]*queue{}
	for _, d := range b.Destinations {
		queues[d] = &queue{}
	}
	type stageChannel struct{ stage, channel string }
	backlog := map[stageChannel]int64{}
	for _, ch := range b.Channels {
		for _, st := range []string{jobs.StageIngress, jobs.StageRouted, jobs.StageOutbound} {
			backlog[stageChannel{st, ch}] = 0
		}
	}
	for _, g := range b.Groups {
		backlog[stageChannel{g.Stage, g.Channel}] += g.Pending
		if g.Stage != jobs.StageOutbound {
			continue
		}
		q := queues[g.Destination]
		if q == nil {
			q = &queue{}
			queues[g.Destination] = q
		}
		q.depth += g.Pending
		q.oldest = max(q.oldest, g.OldestSeconds)
	}
	for d, q := range queues {
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(q.depth), d)
		ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, q.oldest, d)
	}
	for k, n := range backlog {
		ch <- prometheus.MustNewConstMetric(stageBacklogDesc, prometheus.GaugeValue, float64(n), k.stage, k.channel)
	}
}

// read returns the cached backlog and audit forward lags, reading them
// again once CacheTTL passed.
func (c *ClusterCollector) read() (*clusterRead, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ttl := c.CacheTTL
	if ttl <= 0 {
		ttl = defaultCacheTTL
	}
	if c.cached != nil && time.Since(c.at) < ttl {
		return c.cached, nil
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b, err := search.ReadBacklog(ctx, c.Pool)
	var lags []auditforward.Lag
	if err == nil {
		lags, err = auditforward.Lags(ctx, c.Pool)
	}
	if err != nil {
		c.cached = nil
		if !c.failed && c.Logger != nil {
			c.Logger.Warn("cannot read the cluster gauges for /metrics; they are left out until the database answers", "error", err)
		}
		c.failed = true
		return nil, err
	}
	if c.failed && c.Logger != nil {
		c.Logger.Info("cluster gauges for /metrics readable again")
	}
	c.failed = false
	c.cached, c.at = &clusterRead{backlog: b, lags: lags}, time.Now()
	return c.cached, nil
}
