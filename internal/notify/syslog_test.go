package notify_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/testcontainers"
)

// A syslog sink's notification arrives at rsyslog as one RFC 5424
// message naming the rule, over plaintext TCP to loopback and over TLS.
func TestSyslogSinkReachesRsyslog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := certtest.NewOpenSSLCA(t, "syslog-ca")
	cert := ca.Issue(t, "rsyslog", "rsyslog.test", "DNS:rsyslog.test", "IP:127.0.0.1")
	plain := testcontainers.StartRsyslog(t, testcontainers.RsyslogOptions{})
	secure := testcontainers.StartRsyslog(t, testcontainers.RsyslogOptions{CAPEM: readFile(t, ca.CertFile),
		CertPEM: readFile(t, cert.CertFile), KeyPEM: readFile(t, cert.KeyFile)})

	for _, c := range []struct {
		name string
		rs   *testcontainers.Rsyslog
		sink string
	}{
		{"tcp", plain, fmt.Sprintf(`syslog: {address: %q}`, plain.Addr)},
		{"tls", secure, fmt.Sprintf(`syslog: {address: %q, tls: {ca_file: %q, server_name: rsyslog.test}}`, secure.Addr, ca.CertFile)},
	} {
		sink, sender := sinkSender(t, c.sink, nil)
		if err := sender.Send(ctx, sink, firing(t)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lines := c.rs.WaitLines(t, 1)
		want := `<12>1 2026-05-01T02:13:07.000000Z node-a mefor - alert [mefor@32473 rule="lab-dead" state="firing" destination="lab" ` +
			`condition="dead_letters" value="2" threshold="1" unit="rows"] lab-dead firing: destination lab, 2 dead letters (threshold 1)`
		if len(lines) != 1 || lines[0] != want {
			t.Errorf("%s: rsyslog wrote %q, want\n%q", c.name, lines, want)
		}
	}

	// Without the CA the receiver is not trusted: nothing is sent.
	sink, sender := sinkSender(t, fmt.Sprintf(`syslog: {address: %q, tls: {server_name: rsyslog.test}}`, secure.Addr), nil)
	if err := sender.Send(ctx, sink, firing(t)); err == nil || !strings.Contains(err.Error(), "TLS handshake") {
		t.Fatalf("an untrusted receiver: %v, want a failed TLS handshake", err)
	}
	if lines := secure.Lines(t); len(lines) != 1 {
		t.Fatalf("rsyslog has %d lines after an untrusted handshake, want still 1", len(lines))
	}
}
