package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

func TestAuditForwardConfig(t *testing.T) {
	env := map[string]string{"SIEM_TOKEN": "Bearer s3cret"}
	cfg, err := config.Parse("mefor.yaml", []byte(alertsBase+`
audit:
  forward:
    syslog:
      address: siem.example.org:6514
      tls: {ca_file: /etc/mefor/siem-ca.pem, cert_file: /etc/mefor/node.crt, key_file: /etc/mefor/node.key}
    webhook:
      url: https://siem.example.org/mefor
      headers: {Authorization: "${SIEM_TOKEN}"}
egress:
  allow: ["127.0.0.1", "siem.example.org:6514", "siem.example.org:443"]
alerts:
  sinks: {ops: {log: {}}}
  rules:
    - name: siem-behind
      audit_forward: syslog
      queue_depth: 1000
      oldest_queued: 10m
      sinks: [ops]
`), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.Audit.Forward
	if f == nil || f.Interval != 10*time.Second || f.BatchSize != 500 || f.RetryMin != time.Second || f.RetryMax != time.Minute {
		t.Fatalf("audit.forward = %+v, want the defaults", f)
	}
	s := f.Syslog
	if s == nil || s.Address != "siem.example.org:6514" || !s.TLS.Enabled || s.TLS.ServerName != "siem.example.org" ||
		s.TLS.CertFile != "/etc/mefor/node.crt" || s.AppName != "mefor" || s.Facility != 13 || s.Timeout != 10*time.Second || !s.Confirm {
		t.Fatalf("audit.forward.syslog = %+v", s)
	}
	w := f.Webhook
	if w == nil || w.URL != "https://siem.example.org/mefor" || len(w.Headers) != 1 || w.Headers[0].Value != "Bearer s3cret" {
		t.Fatalf("audit.forward.webhook = %+v", w)
	}
	var targets []string
	for _, o := range cfg.Outbound() {
		targets = append(targets, o.Target+"="+o.Address()+"/"+o.Protocol)
	}
	got := strings.Join(targets, " ")
	for _, want := range []string{"audit_forward:syslog=siem.example.org:6514/syslog-tls", "audit_forward:webhook=siem.example.org:443/https"} {
		if !strings.Contains(got, want) {
			t.Errorf("outbound connections %s lack %s", got, want)
		}
	}
	if r := cfg.Alerts.Rules[0]; r.AuditForward != "syslog" || r.QueueDepth != 1000 {
		t.Errorf("rule = %+v", r)
	}

	// Without a tls: block syslog is still TLS, against the system's roots.
	cfg, err = config.Parse("mefor.yaml", []byte(alertsBase+`
audit: {forward: {syslog: {address: "siem.example.org:6514"}}}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Audit.Forward.Syslog; !s.TLS.Enabled || s.TLS.CAFile != "" || s.TLS.ServerName != "siem.example.org" {
		t.Errorf("syslog without tls: %+v, want TLS on with the system's roots", s.TLS)
	}
}

func TestAuditForwardConfigErrors(t *testing.T) {
	_, err := config.Parse("mefor.yaml", []byte(alertsBase+`
audit:
  forward:
    interval: 10ms
    batch_size: 0
    retry_min: 2m
    retry_max: 1m
    syslog:
      address: siem.example.org
      facility: 30
      tls: {cert_file: /etc/mefor/node.crt}
    webhook:
      url: "ftp://siem.example.org/x?token=TOPSECRET"
egress:
  allow: ["127.0.0.1"]
alerts:
  sinks: {ops: {log: {}}}
  rules:
    - name: siem-behind
      audit_forward: syslogg
      dead_letters: 1
      sinks: [ops]
`), nil)
	checkErrText(t, err, "TOPSECRET", []string{
		`mefor.yaml:14: audit.forward.interval must be at least 1s`,
		`mefor.yaml:15: audit.forward.batch_size must be from 1 to 10000`,
		`mefor.yaml:17: audit.forward.retry_max breaks retry_min <= retry_max (got retry_min 2m, retry_max 1m)`,
		`mefor.yaml:19: audit.forward.syslog.address must be host:port`,
		`mefor.yaml:20: audit.forward.syslog.facility must be a syslog facility number from 0 to 23`,
		`audit.forward.syslog.tls.key_file is required with cert_file`,
		`mefor.yaml:23: audit.forward.webhook.url must be an http:// or https:// URL with a host`,
		`mefor.yaml:30: alerts.rules[0].audit_forward "syslogg" is not an audit.forward target of this config; use one of syslog, webhook`,
		`mefor.yaml:31: alerts.rules[0].dead_letters does not apply to an audit_forward rule`,
	})

	_, err = config.Parse("mefor.yaml", []byte(alertsBase+`
audit:
  forward:
    syslog: {address: "siem.example.org:6514"}
egress:
  allow: ["127.0.0.1"]
`), nil)
	if err == nil || !strings.Contains(err.Error(), `mefor.yaml:14: audit.forward.syslog.address siem.example.org:6514 is not in egress.allow`) {
		t.Errorf("a syslog receiver outside egress.allow: %v", err)
	}
	_, err = config.Parse("mefor.yaml", []byte(alertsBase+`
audit: {forward: {}}
`), nil)
	if err == nil || !strings.Contains(err.Error(), `audit.forward has no target`) {
		t.Errorf("audit.forward without a target: %v", err)
	}
}
