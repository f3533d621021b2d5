package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

const alertsBase = `
channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes:
      - destinations: [downstream]
destinations:
  downstream:
    type: mllp
    mllp: {address: "127.0.0.1:2576"}
`

func TestAlertsConfig(t *testing.T) {
	env := map[string]string{"HOOK_TOKEN": "Bearer s3cret"}
	cfg, err := config.Parse("mefor.yaml", []byte(alertsBase+`
alerts:
  interval: 5s
  sinks:
    ops:
      webhook: {url: "https://hooks.example.org/mefor", headers: {Authorization: "${HOOK_TOKEN}"}}
    journal:
      log: {level: error}
  rules:
    - name: downstream-backlog
      destination: downstream
      oldest_queued: 10m
      queue_depth: 500
      sinks: [ops, journal]
    - name: adt-quiet
      channel: adt
      no_traffic: 30m
      dead_letters: 1
      sinks: journal
`), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Alerts
	if a == nil || a.Interval != 5*time.Second || len(a.Sinks) != 2 || len(a.Rules) != 2 {
		t.Fatalf("alerts = %+v", a)
	}
	ops := a.Sink("ops")
	if ops.Kind() != "webhook" || ops.Webhook.URL != "https://hooks.example.org/mefor" || ops.Webhook.Timeout != 10*time.Second ||
		len(ops.Webhook.Headers) != 1 || ops.Webhook.Headers[0] != (config.Header{Name: "Authorization", Value: "Bearer s3cret"}) {
		t.Fatalf("sink ops = %+v %+v", ops, ops.Webhook)
	}
	if j := a.Sink("journal"); j.Kind() != "log" || j.Log.Level != "error" {
		t.Fatalf("sink journal = %+v", j)
	}
	r := a.Rules[0]
	if r.Name != "downstream-backlog" || r.Destination != "downstream" || r.OldestQueued != 10*time.Minute ||
		r.QueueDepth != 500 || r.DeadLetters != 0 || r.NoTraffic != 0 || strings.Join(r.Sinks, ",") != "ops,journal" {
		t.Fatalf("rule 0 = %+v", r)
	}
	if r := a.Rules[1]; r.Channel != "adt" || r.NoTraffic != 30*time.Minute || r.DeadLetters != 1 || len(r.Sinks) != 1 {
		t.Fatalf("rule 1 = %+v", r)
	}

	if cfg, err := config.Parse("mefor.yaml", []byte(alertsBase), nil); err != nil || cfg.Alerts != nil {
		t.Fatalf("no alerts section: %v, %+v", err, cfg.Alerts)
	}
}

func TestAlertsConfigErrors(t *testing.T) {
	_, err := config.Parse("mefor.yaml", []byte(alertsBase+`
alerts:
  interval: 100ms
  sinks:
    ops:
      webhook: {url: "ftp://hooks.example.org/x?token=TOPSECRET", headers: {Authorization: "${NOT_SET}"}}
    both:
      webhook: {url: "https://a.example.org"}
      log: {}
    journal:
      log: {level: loud}
  rules:
    - name: a
      destination: downstreem
      oldest_queued: 10m
      sinks: [opz]
    - name: a
      channel: adt
      sinks: [journal]
    - destination: downstream
      channel: adt
      queue_depth: 0
      sinks: []
`), nil)
	checkErrText(t, err, "TOPSECRET", []string{
		`mefor.yaml:13: alerts.interval must be at least 1s (e.g. interval: 30s)`,
		`mefor.yaml:16: alerts.sinks.ops.webhook.url must be an http:// or https:// URL with a host`,
		`mefor.yaml:16: alerts.sinks.ops.webhook.headers.Authorization uses ${NOT_SET}, but NOT_SET is not set`,
		`mefor.yaml:17: alerts.sinks.both has both webhook and log`,
		`mefor.yaml:21: alerts.sinks.journal.log.level "loud" is not a level; use one of info, warn, error`,
		`mefor.yaml:24: alerts.rules[0].destination "downstreem" is not a destination of this config; did you mean "downstream"?`,
		`mefor.yaml:26: alerts.rules[0].sinks[0] "opz" is not a sink (declare it under alerts.sinks); did you mean "ops"?`,
		`mefor.yaml:27: alerts.rules[1].name "a" is already the name of rules[0]`,
		`alerts.rules[1] has no condition; give at least one of oldest_queued: 10m, queue_depth: 500, dead_letters: 1, no_traffic: 30m`,
		`mefor.yaml:31: alerts.rules[2].channel and destination are both set`,
		`mefor.yaml:32: alerts.rules[2].queue_depth must be at least 1`,
		`mefor.yaml:33: alerts.rules[2].sinks is required: the sinks to notify`,
		`alerts.rules[2].name is required`,
	})
}

// A sink defined twice is refused where it is defined again, as any other
// name is.
func TestAlertSinkDefinedTwice(t *testing.T) {
	_, err := config.Parse("mefor.yaml", []byte(alertsBase+`
alerts:
  sinks:
    ops: {log: {}}
    ops: {log: {level: error}}
`), nil)
	want := `mefor.yaml:15: alerts.sinks.ops is defined twice (first on line 14); sink names must be unique`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Parse = %v, want an error containing %q", err, want)
	}
}
