package metrics_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/metrics"
)

const examples = "../../examples/monitoring"

// exposed lists the names of every mefor_ metric a node can expose.
func exposed(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New(metrics.Options{Node: &metrics.NodeGauges{
		HoldsLease:      func() bool { return true },
		ConfigVersion:   func() int64 { return 1 },
		HeartbeatAge:    func() (float64, bool) { return 0.5, true },
		CPUContended:    func() bool { return false },
		OpenConnections: func() map[string]int { return map[string]int{"c": 1} },
	}})
	recordOneOfEach(m) // vectors only show once they have a child
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	// The cluster gauges need a database to collect; their descriptions
	// name them.
	descs := make(chan *prometheus.Desc, 16)
	(&metrics.ClusterCollector{}).Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		names[fq.FindStringSubmatch(d.String())[1]] = true
	}
	return names
}

var metricName = regexp.MustCompile(`\bmefor_[a-z_]+`)

// checkNames fails for each mefor_ metric expr names that no node exposes.
func checkNames(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	for _, name := range metricName.FindAllString(expr, -1) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			t.Errorf("%s uses %s, which mefor does not expose", where, name)
		}
	}
}

// The shipped alert rules and dashboard only use metrics mefor exposes,
// under their exact names; with promtool on the PATH, the rules also pass
// promtool's checks and unit tests.
func TestMonitoringExamples(t *testing.T) {
	known := exposed(t)
	for _, want := range []string{
		"mefor_messages_received_total", "mefor_messages_rejected_total", "mefor_deliveries_total",
		"mefor_dead_letters_total", "mefor_delivery_duration_seconds", "mefor_ack_duration_seconds",
		"mefor_queue_depth", "mefor_queue_oldest_age_seconds", "mefor_stage_backlog",
		"mefor_lease_holder", "mefor_river_leader", "mefor_config_version", "mefor_node_heartbeat_age_seconds",
		"mefor_reference_sync_failures_total", "mefor_maintenance_runs_total", "mefor_drainer_gathers_total", "mefor_handoffs_shared_total", "mefor_handoff_turns_failed_total",
		"mefor_cpu_contended", "mefor_intake_commit_wait_seconds", "mefor_intake_commit_seconds", "mefor_intake_commit_messages",
		"mefor_lane_reads_shared_total", "mefor_connections_refused_total", "mefor_connections_open", "mefor_egress_refused_total",
	} {
		if !known[want] {
			t.Errorf("metric %s is not exposed", want)
		}
	}

	raw, err := os.ReadFile(filepath.Join(examples, "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("rules.yml: %v", err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Expr == "" || r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("rules.yml group %s: rule %+v lacks alert, expr, severity or summary", g.Name, r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rules.yml %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			checkNames(t, "rules.yml "+r.Alert, r.Expr, known)
		}
	}
	if n < 10 {
		t.Errorf("rules.yml has %d rules", n)
	}

	raw, err = os.ReadFile(filepath.Join(examples, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 5 {
		t.Errorf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkNames(t, "dashboard panel "+p.Title, tg.Expr, known)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		// CI sets MEFOR_REQUIRE_PROMTOOL (.ci/run): there, rules that
		// promtool would reject must fail the build, not pass unchecked.
		if os.Getenv("MEFOR_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not on PATH and MEFOR_REQUIRE_PROMTOOL is set: export PATH=\"$(bash .ci/promtool.sh):$PATH\"")
		}
		t.Log("promtool not on PATH: rules checked by parsing only")
		return
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}, {"check", "config", "prometheus.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = examples
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
