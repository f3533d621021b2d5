package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/testcontainers"
)

const auditForwardYAML = `channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [lab]}]
destinations:
  lab: {type: mllp, mllp: {address: "127.0.0.1:2576"}}
audit:
  forward:
    syslog:
      address: "127.0.0.1:6514"
      tls: {ca_file: CAFILE}
    webhook: {url: "https://127.0.0.1:8443/audit"}
`

// config check reports audit.forward like every other section, the files
// its TLS blocks name included.
func TestConfigCheckAuditForward(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, bad, missing := dir+"/good.yaml", dir+"/bad.yaml", dir+"/missing.yaml"
	writeFile(t, dir+"/ca.crt", "")
	writeFile(t, good, strings.Replace(auditForwardYAML, "CAFILE", dir+"/ca.crt", 1))
	writeFile(t, bad, strings.Replace(strings.Replace(auditForwardYAML, "CAFILE", dir+"/ca.crt", 1), `"127.0.0.1:6514"`, `"127.0.0.1"`, 1))
	writeFile(t, missing, strings.Replace(auditForwardYAML, "CAFILE", dir+"/nope.crt", 1))
	var out, errb strings.Builder
	if code := run([]string{"config", "check", "--no-tls-files", good}, &out, &errb); code != 0 {
		t.Fatalf("config check good: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	code := run([]string{"config", "check", "--no-tls-files", bad}, &out, &errb)
	if want := `bad.yaml:10: audit.forward.syslog.address must be host:port`; code != 1 || !strings.Contains(out.String(), want) {
		t.Fatalf("config check bad: exit %d, want 1 and %q in\n%s", code, want, out.String())
	}
	out.Reset()
	code = run([]string{"config", "check", missing}, &out, &errb)
	if want := `missing.yaml:11: audit.forward.syslog.tls.ca_file ` + dir + `/nope.crt cannot be read`; code != 1 || !strings.Contains(out.String(), want) {
		t.Fatalf("config check missing CA: exit %d, want 1 and %q in\n%s", code, want, out.String())
	}
}

type refusingSender struct{ err error }

func (s refusingSender) Send(context.Context, []auditforward.Item) error { return s.err }

// mefor status says when a receiver of the audit trail is behind, and why.
func TestStatusShowsAuditForwardBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	for range 3 {
		if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionReload}); err != nil {
			t.Fatal(err)
		}
	}
	status := func() string { return runOK(t, "status", "--database-url", db.URL) }
	fw := &auditforward.Forwarder{DB: db.Pool, Target: auditforward.TargetSyslog, RetryFor: 10 * time.Millisecond,
		Sender: refusingSender{errors.New("syslog receiver siem.example.org:6514: connect: connection refused")}}
	if _, err := fw.Run(ctx); err == nil {
		t.Fatal("a refusing receiver accepted the batch")
	}
	want := "warning: audit forward to syslog is 3 rows behind"
	if out := status(); !strings.Contains(out, want) || !strings.Contains(out, "siem.example.org:6514: connect: connection refused") {
		t.Fatalf("status while the receiver refuses:\n%s\nwant %q and the refusal", out, want)
	}
	fw.Sender = refusingSender{}
	if _, err := fw.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if out := status(); !strings.Contains(out, "audit forward to syslog: up to date (row 3, anchor 0;") {
		t.Fatalf("status once the receiver has every row:\n%s", out)
	}
}
