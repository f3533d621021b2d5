package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

func TestAlertEmailAndSyslogSinks(t *testing.T) {
	env := map[string]string{"SMTP_PASSWORD": "pa55word"}
	cfg, err := config.Parse("mefor.yaml", []byte(alertsBase+`
egress:
  allow: [smtp.example.org:587, syslog.example.org:6514, 127.0.0.1]
alerts:
  sinks:
    mail:
      email:
        address: smtp.example.org:587
        from: mefor@example.org
        to: [oncall@example.org, "Lab Team <lab@example.org>"]
        username: mefor
        password: "${SMTP_PASSWORD}"
        tls: {ca_file: /etc/mefor/tls/smtp-ca.crt}
    siem:
      syslog: {address: syslog.example.org:6514, tls: {ca_file: /etc/mefor/tls/siem-ca.crt}}
    relay:
      syslog: {address: 127.0.0.1:514}
  rules:
    - name: downstream-backlog
      destination: downstream
      queue_depth: 500
      sinks: [mail, siem, relay]
`), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
	m := cfg.Alerts.Sink("mail")
	e := m.Email
	if m.Kind() != config.SinkEmail || e.Address != "smtp.example.org:587" || e.From != "mefor@example.org" ||
		strings.Join(e.To, ",") != "oncall@example.org,Lab Team <lab@example.org>" || !e.StartTLS ||
		e.Username != "mefor" || e.Password != "pa55word" || e.Timeout != 10*time.Second ||
		!e.TLS.Enabled || e.TLS.CAFile != "/etc/mefor/tls/smtp-ca.crt" || e.TLS.ServerName != "smtp.example.org" {
		t.Fatalf("sink mail = %+v", e)
	}
	s := cfg.Alerts.Sink("siem")
	if s.Kind() != config.SinkSyslog || s.Syslog.Address != "syslog.example.org:6514" || !s.Syslog.TLS.Enabled ||
		s.Syslog.TLS.ServerName != "syslog.example.org" || s.Syslog.Facility != 1 || s.Syslog.AppName != "mefor" || !s.Syslog.Confirm {
		t.Fatalf("sink siem = %+v", s.Syslog)
	}
	if r := cfg.Alerts.Sink("relay").Syslog; r.TLS.Enabled {
		t.Fatalf("a syslog sink without tls: speaks TLS: %+v", r)
	}
	var got []string
	for _, o := range cfg.Outbound() {
		got = append(got, fmt.Sprintf("%s %s %s", o.Target, o.Address(), o.Protocol))
	}
	for _, want := range []string{"alert_sink:mail smtp.example.org:587 smtp-starttls", "alert_sink:siem syslog.example.org:6514 syslog-tls",
		"alert_sink:relay 127.0.0.1:514 syslog"} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("Outbound lacks %q: %q", want, got)
		}
	}

	// A password written in the file works, and is flagged.
	cfg, err = config.Parse("mefor.yaml", []byte(alertsBase+`
alerts:
  sinks:
    mail:
      email: {address: "127.0.0.1:25", from: a@example.org, to: b@example.org, username: u, password: hunter2}
  rules:
    - {name: r, destination: downstream, queue_depth: 1, sinks: [mail]}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if w := fmt.Sprint(cfg.Warnings); !strings.Contains(w, "alerts.sinks.mail.email.password is written in the file; write it as ${VAR}") ||
		strings.Contains(w, "hunter2") {
		t.Errorf("warnings = %s, want the literal password flagged, not quoted", w)
	}
}

// Plaintext to another machine is refused, naming the key, unless
// acknowledged; loopback is fine.
func TestAlertSinksRefusePlaintext(t *testing.T) {
	parse := func(sink string) error {
		_, err := config.Parse("mefor.yaml", []byte(alertsBase+`
alerts:
  sinks:
    s:
      `+sink+`
  rules:
    - {name: r, destination: downstream, queue_depth: 1, sinks: [s]}
`), func(string) (string, bool) { return "pa55word", true })
		return err
	}
	for _, c := range []struct{ sink, want string }{
		{`email: {address: "smtp.example.org:25", from: a@example.org, to: [b@example.org], starttls: false, username: u, password: "${P}"}`,
			`mefor.yaml:15: alerts.sinks.s.email.starttls is false for smtp.example.org:25, another machine: the mail and the password would cross the network unencrypted`},
		{`syslog: {address: "syslog.example.org:514"}`,
			`mefor.yaml:15: alerts.sinks.s.syslog.address syslog.example.org:514 is another machine and there is no tls: block`},
		{`email: {address: "smtp.example.org:25", from: a@example.org, to: [b@example.org], starttls: false, tls: {}}`,
			`alerts.sinks.s.email.tls is set but starttls is false`},
		{`syslog: {address: "syslog.example.org:6514", tls: {}, plaintext: true}`,
			`alerts.sinks.s.syslog.plaintext is true but a tls: block is set too`},
	} {
		err := parse(c.sink)
		var errs config.Errors
		if !errors.As(err, &errs) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.sink, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "pa55word") {
			t.Errorf("an error quotes the password: %v", err)
		}
	}
	for _, ok := range []string{
		`email: {address: "127.0.0.1:25", from: a@example.org, to: [b@example.org], starttls: false}`,
		`email: {address: "smtp.example.org:25", from: a@example.org, to: [b@example.org], starttls: false, plaintext: true}`,
		`syslog: {address: "localhost:514"}`,
		`syslog: {address: "syslog.example.org:514", plaintext: true}`,
	} {
		if err := parse(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestAlertEmailAndSyslogSinkErrors(t *testing.T) {
	_, err := config.Parse("mefor.yaml", []byte(alertsBase+`
egress:
  allow: [127.0.0.1]
alerts:
  sinks:
    mail:
      email: {address: smtp.example.org, from: "not an address", to: [ok@example.org, "bad@"], password: "${P}", timeout: 0s}
    nomail:
      email: {}
    siem:
      syslog: {address: "syslog.example.org:6514", tls: {}, facility: 24, app_name: "two words"}
    both:
      email: {address: "127.0.0.1:25", from: a@example.org, to: [b@example.org]}
      syslog: {address: "127.0.0.1:514"}
  rules:
    - {name: r, destination: downstream, queue_depth: 1, sinks: [mail, nomail, siem, both]}
`), func(string) (string, bool) { return "pa55word", true })
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse = %v, want config.Errors", err)
	}
	text := err.Error()
	for _, want := range []string{
		`mefor.yaml:17: alerts.sinks.mail.email.address must be host:port with a port from 1 to 65535, e.g. address: smtp.example.org:587`,
		`mefor.yaml:17: alerts.sinks.mail.email.from "not an address" is not a mail address`,
		`mefor.yaml:17: alerts.sinks.mail.email.to[1] "bad@" is not a mail address`,
		`alerts.sinks.mail.email.username is required with password`,
		`alerts.sinks.mail.email.timeout must be > 0`,
		`alerts.sinks.nomail.email.address is required: the SMTP server's host:port`,
		`alerts.sinks.nomail.email.from is required`,
		`alerts.sinks.nomail.email.to is required`,
		`mefor.yaml:21: alerts.sinks.siem.syslog.facility must be a syslog facility number from 0 to 23`,
		`alerts.sinks.siem.syslog.app_name must be 1 to 48 printable characters`,
		`mefor.yaml:21: alerts.sinks.siem.syslog.address syslog.example.org:6514 is not in egress.allow`,
		`alerts.sinks.both has both email and syslog`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("errors lack %q:\n%s", want, text)
		}
	}
}
