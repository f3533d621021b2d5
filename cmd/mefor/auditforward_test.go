package main

import (
	"strings"
	"testing"
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
