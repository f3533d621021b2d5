package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/mefor/mefor/internal/admin"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// gatherMetrics reads the node's registry as a scrape would.
func gatherMetrics(t *testing.T, n *engine.Node) map[string]*dto.MetricFamily {
	t.Helper()
	list, err := n.Metrics().Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, f := range list {
		fams[f.GetName()] = f
	}
	return fams
}

// sample finds the sample of family name whose labels are exactly labels
// ("k=v" pairs); ok is false when there is none.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (*dto.Metric, bool) {
	f, ok := fams[name]
	if !ok {
		return nil, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				match = false
				break
			}
		}
		if match {
			return m, true
		}
	}
	return nil, false
}

// value is a counter's or gauge's value, or a histogram's count; -1 when
// the sample is absent.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m, ok := sample(fams, name, labels...)
	switch {
	case !ok:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// histogram is a snapshot of the node's histogram name (without labels):
// its count, its sum and how many observations were above over seconds.
type histogram struct {
	count, above uint64
	sum          float64
}

func histogramOf(t *testing.T, n *engine.Node, name string, over float64) histogram {
	t.Helper()
	if f, ok := gatherMetrics(t, n)[name]; ok {
		h := f.GetMetric()[0].GetHistogram()
		out := histogram{count: h.GetSampleCount(), sum: h.GetSampleSum(), above: h.GetSampleCount()}
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == over {
				out.above -= b.GetCumulativeCount()
				return out
			}
		}
		t.Fatalf("%s has no bucket bound %v", name, over)
	}
	t.Fatalf("the node exposes no %s", name)
	return histogram{}
}

func (h histogram) minus(o histogram) histogram {
	return histogram{count: h.count - o.count, above: h.above - o.above, sum: h.sum - o.sum}
}

// /metrics, read with the Prometheus text parser, names what a user sees:
// while a destination is stuck its queue depth and oldest age are up and
// its failed attempts are counted by outcome; once it drains the depth is
// back to 0 and the successful deliveries are counted.
func TestMetricsWhileStuckAndAfterDrain(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	lab := newPartner(t, "", rejectAll)
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, stuckLab(lab.addr)+mllpDest("void", fixtures.FreeAddr(t), "connect_timeout: 1s", "retry: {max_attempts: 1}"))
	node := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.MetricsCacheTTL = 50 * time.Millisecond })
	adm := &admin.Server{Pool: db.Pool, NodeID: t.Name(), Serving: node.Lease().Serving,
		Metrics: node.MetricsHandler(), Logger: fixtures.Logger(t)}
	if err := adm.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Stop(context.Background()) })

	send(t, listen, adt("M000", "P1"), adt("M001", "P2"), adt("M002", "P3"))
	c := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second}
	defer c.Close()
	if _, err := c.Send(context.Background(), []byte("not an HL7 message")); err != nil {
		t.Fatalf("send malformed: %v", err)
	}

	var fams map[string]*dto.MetricFamily
	fixtures.Eventually(t, 20*time.Second, "lab stuck behind its head, void dead-lettered", func() bool {
		fams = fixtures.Scrape(t, adm.Addr())
		return value(fams, "mefor_deliveries_total", "destination", "lab", "outcome", "AR") >= 2 &&
			value(fams, "mefor_queue_depth", "destination", "lab") == 3 &&
			value(fams, "mefor_dead_letters_total", "destination", "void") == 3
	})
	checks := []struct {
		name   string
		labels []string
		ok     func(float64) bool
		want   string
	}{
		{"mefor_messages_received_total", []string{"channel", "adt"}, eq(4), "4"},
		{"mefor_messages_rejected_total", []string{"channel", "adt", "reason", "unparseable"}, eq(1), "1"},
		{"mefor_ack_duration_seconds", []string{"channel", "adt"}, eq(4), "4 observations"},
		{"mefor_deliveries_total", []string{"destination", "void", "outcome", "refused"}, eq(3), "3"},
		{"mefor_stage_backlog", []string{"stage", "outbound", "channel", "adt"}, eq(3), "3"},
		{"mefor_stage_backlog", []string{"stage", "ingress", "channel", "adt"}, eq(0), "0"},
		{"mefor_queue_depth", []string{"destination", "void"}, eq(0), "0"},
		{"mefor_queue_oldest_age_seconds", []string{"destination", "lab"}, gt(0), "> 0"},
		{"mefor_delivery_duration_seconds", []string{"destination", "lab"}, gt(1), ">= 2 observations"},
		{"mefor_lease_holder", nil, eq(1), "1"},
		{"mefor_config_version", nil, gt(-1), "present"},
		{"mefor_node_heartbeat_age_seconds", nil, func(v float64) bool { return v >= 0 && v < 10 }, "0..10"},
		{"mefor_cluster_gauges_up", nil, eq(1), "1"},
		{"go_goroutines", nil, gt(0), "> 0"},
		{"process_resident_memory_bytes", nil, gt(0), "> 0"},
	}
	for _, c := range checks {
		if v := value(fams, c.name, c.labels...); !c.ok(v) {
			t.Errorf("while stuck: %s%v = %v, want %s", c.name, c.labels, v, c.want)
		}
	}
	if _, ok := fams["mefor_river_leader"]; !ok {
		t.Errorf("while stuck: mefor_river_leader missing")
	}
	lint(t, fams)
	if v := value(fams, "mefor_deliveries_total", "destination", "lab", "outcome", "ok"); v > 0 {
		t.Errorf("while stuck: lab ok deliveries = %v, want none", v)
	}

	lab.setAnswer(nil) // the partner recovers: AA from now on
	fixtures.Eventually(t, 20*time.Second, "lab drained", func() bool {
		fams = fixtures.Scrape(t, adm.Addr())
		return value(fams, "mefor_queue_depth", "destination", "lab") == 0
	})
	// The counters lag the commit that drained the queue by the time the
	// drainer takes to count: read them until they arrive.
	fixtures.Eventually(t, 5*time.Second, "ok deliveries counted", func() bool {
		fams = fixtures.Scrape(t, adm.Addr())
		return value(fams, "mefor_deliveries_total", "destination", "lab", "outcome", "ok") == 3
	})
	if v := value(fams, "mefor_queue_oldest_age_seconds", "destination", "lab"); v != 0 {
		t.Errorf("after drain: oldest age of lab = %v, want 0", v)
	}
	if v := value(fams, "mefor_stage_backlog", "stage", "outbound", "channel", "adt"); v != 0 {
		t.Errorf("after drain: outbound backlog = %v, want 0", v)
	}
	if v := value(fams, "mefor_dead_letters_total", "destination", "lab"); v > 0 {
		t.Errorf("after drain: lab dead letters = %v, want none", v)
	}
}

// lint fails for each problem Prometheus's linter (the rules of promtool
// check metrics) finds in a scrape: a counter without _total, a unit
// Prometheus does not use, a missing help text. A dashboard is written
// against these names once; they cannot be fixed later without breaking it.
func lint(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	list := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		list = append(list, f)
	}
	problems, err := promlint.NewWithMetricFamilies(list).Lint()
	if err != nil {
		t.Fatalf("lint /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("/metrics: %s: %s", p.Metric, p.Text)
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func gt(min float64) func(float64) bool  { return func(v float64) bool { return v > min } }
