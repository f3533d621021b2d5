package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/workers"
)

func TestAlertsListCLI(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t) // lab has one dead letter and one queued delivery
	ctx := context.Background()
	if out := f.ok(t, "alerts", "list"); !strings.Contains(out, "no alert rules evaluated yet") {
		t.Fatalf("alerts list before any evaluation:\n%s", out)
	}
	cfg, err := config.Parse("mefor.yaml", []byte(alertsYAML), nil)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := workers.EvaluateAlerts(ctx, &workers.Deps{Pool: f.db.Pool}, cfg.Alerts, f.q)
	if err != nil || len(changes) != 1 || changes[0].Rule != "lab-dead" {
		t.Fatalf("evaluation: %+v, %v; want lab-dead firing", changes, err)
	}
	if err := alert.RecordNotification(ctx, f.db.Pool, "lab-dead", "ops", "firing",
		"alert lab-dead firing to sink ops, attempt 1 of 25: POST to hooks.example.org: answered 500 Internal Server Error (will retry)"); err != nil {
		t.Fatal(err)
	}

	out := f.ok(t, "alerts", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "RULE") {
		t.Fatalf("alerts list:\n%s", out)
	}
	for _, want := range []string{"adt-quiet", "ok", "no_traffic", "1h0m0s", "none"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("adt-quiet line lacks %q: %s", want, lines[1])
		}
	}
	for _, want := range []string{"lab-dead", "firing", "dead_letters", "1", "firing to ops failed: attempt 1 of 25: POST to hooks.example.org: answered 500"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("lab-dead line lacks %q: %s", want, lines[2])
		}
	}
	list := decode[[]alert.Alert](t, f.ok(t, "alerts", "list", "--json"))
	if len(list) != 2 || list[1].Rule != "lab-dead" || list[1].State != "firing" || list[1].Value == nil || *list[1].Value != 1 ||
		list[1].LastSink != "ops" || list[1].LastNotifyError == "" {
		t.Fatalf("alerts list --json = %+v", list)
	}
}

const alertsYAML = `
channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes:
      - destinations: [lab]
destinations:
  lab:
    type: mllp
    mllp: {address: "127.0.0.1:2576"}
alerts:
  sinks:
    ops:
      webhook: {url: "https://hooks.example.org/mefor"}
  rules:
    - name: lab-dead
      destination: lab
      dead_letters: 1
      sinks: [ops]
    - name: adt-quiet
      channel: adt
      no_traffic: 1h
      sinks: [ops]
`

// config check reports alert rules and sinks like every other section.
func TestConfigCheckAlerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := dir + "/good.yaml"
	bad := dir + "/bad.yaml"
	writeFile(t, good, alertsYAML)
	writeFile(t, bad, strings.Replace(alertsYAML, "sinks: [ops]\n    - name: adt-quiet", "sinks: [opz]\n    - name: adt-quiet", 1))
	var out, errb strings.Builder
	if code := run([]string{"config", "check", good}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ok (1 channels, 0 handlers, 1 destinations, 2 alert rules)") {
		t.Fatalf("config check good: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	code := run([]string{"config", "check", bad}, &out, &errb)
	if want := `bad.yaml:19: alerts.rules[0].sinks[0] "opz" is not a sink (declare it under alerts.sinks); did you mean "ops"?`; code != 1 || !strings.Contains(out.String(), want) {
		t.Fatalf("config check bad: exit %d, want 1 and %q in\n%s", code, want, out.String())
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
