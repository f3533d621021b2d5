package notify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/notify"
	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/testcontainers"
)

const sinkBase = `
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
  rules:
    - {name: lab-dead, destination: lab, dead_letters: 1, sinks: [s]}
  sinks:
    s:
`

// sinkSender parses a config whose sink s is sinkYAML and returns the sink
// and a sender using the config's TLS files, as a node does.
func sinkSender(t *testing.T, sinkYAML string, env map[string]string) (*config.AlertSink, *notify.Sender) {
	t.Helper()
	cfg, err := config.Parse("mefor.yaml", []byte(sinkBase+"      "+sinkYAML+"\n"), func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Alerts.Sink("s"), &notify.Sender{Hostname: "node-a",
		Transport: func(s *config.AlertSink) notify.Transport { return notify.TransportOf(nil, set, s.Name) }}
}

func firing(t *testing.T) []byte {
	t.Helper()
	at := time.Date(2026, 5, 1, 2, 13, 7, 0, time.UTC)
	b, err := json.Marshal(notify.Notification{Rule: "lab-dead", State: "firing", Destination: "lab",
		Condition: "dead_letters", Value: 2, Threshold: 1, Unit: "rows",
		Breaches: []notify.Reading{{Condition: "dead_letters", Value: 2, Threshold: 1}}, Since: at, At: at,
		Summary: "lab-dead firing: destination lab, 2 dead letters (threshold 1)"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The mail reaches every recipient over STARTTLS, authenticated, with a
// subject naming the rule and its state; a wrong password sends nothing
// and the error does not quote it.
func TestEmailSinkMailsEveryRecipientOverSTARTTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := certtest.NewOpenSSLCA(t, "smtp-ca")
	cert := ca.Issue(t, "smtp", "smtp.test", "DNS:smtp.test", "IP:127.0.0.1")
	srv := testcontainers.StartSMTP(t, testcontainers.SMTPOptions{CertPEM: readFile(t, cert.CertFile), KeyPEM: readFile(t, cert.KeyFile),
		User: "mefor", Password: "pa55word"})
	mailSink := func(password string) string {
		return fmt.Sprintf(`email: {address: %q, from: "mefor <mefor@example.org>", to: [oncall@example.org, lab@example.org],
        username: mefor, password: "${SMTP_PASSWORD}", tls: {ca_file: %q, server_name: smtp.test}}`, srv.Addr, ca.CertFile)
	}

	sink, sender := sinkSender(t, mailSink(""), map[string]string{"SMTP_PASSWORD": "pa55word"})
	if err := sender.Send(ctx, sink, firing(t)); err != nil {
		t.Fatal(err)
	}
	mails := srv.Mails(t)
	if len(mails) != 1 {
		t.Fatalf("the server accepted %d mails, want 1", len(mails))
	}
	m := mails[0]
	if m.From != "mefor@example.org" || strings.Join(m.To, ",") != "oncall@example.org,lab@example.org" || m.User != "mefor" {
		t.Fatalf("mail from %q to %q as %q, want from mefor@example.org to both recipients, authenticated as mefor", m.From, m.To, m.User)
	}
	for _, want := range []string{"Subject: [mefor] firing: lab-dead (destination lab)\r\n", "To: <oncall@example.org>, <lab@example.org>\r\n",
		"lab-dead firing: destination lab, 2 dead letters (threshold 1)", `"rule": "lab-dead"`} {
		if !strings.Contains(m.Data, want) {
			t.Errorf("the mail lacks %q:\n%s", want, m.Data)
		}
	}

	sink, sender = sinkSender(t, mailSink(""), map[string]string{"SMTP_PASSWORD": "WRONGpass"})
	err := sender.Send(ctx, sink, firing(t))
	if err == nil || !strings.Contains(err.Error(), "SMTP server "+srv.Addr+": AUTH as mefor: 535") || strings.Contains(err.Error(), "WRONGpass") {
		t.Fatalf("a wrong password: %v, want the AUTH refusal, without the password", err)
	}
	if n := len(srv.Mails(t)); n != 1 {
		t.Fatalf("the server has %d mails after a refused AUTH, want still 1", n)
	}
}

// A server that does not offer STARTTLS gets nothing unless the sink says
// starttls: false (which config allows only to loopback, or with
// plaintext: true).
func TestEmailSinkRequiresSTARTTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testcontainers.StartSMTP(t, testcontainers.SMTPOptions{})

	sink, sender := sinkSender(t, fmt.Sprintf(`email: {address: %q, from: mefor@example.org, to: [oncall@example.org]}`, srv.Addr), nil)
	err := sender.Send(ctx, sink, firing(t))
	if err == nil || !strings.Contains(err.Error(), "does not offer STARTTLS, which starttls requires; nothing was sent") {
		t.Fatalf("a server without STARTTLS: %v, want refused", err)
	}
	if n := len(srv.Mails(t)); n != 0 {
		t.Fatalf("the server got %d mails without STARTTLS, want none", n)
	}

	sink, sender = sinkSender(t, fmt.Sprintf(`email: {address: %q, from: mefor@example.org, to: [oncall@example.org], starttls: false}`, srv.Addr), nil)
	if err := sender.Send(ctx, sink, firing(t)); err != nil {
		t.Fatal(err)
	}
	if mails := srv.Mails(t); len(mails) != 1 || !strings.Contains(mails[0].Data, "Subject: [mefor] firing: lab-dead") {
		t.Fatalf("with starttls: false the server got %+v", mails)
	}
}
