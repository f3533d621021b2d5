package tlsconf_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/tlsconf"
)

// HTTP reference sources and alert webhooks take the destinations' tls:
// block: their files are read and listed like a destination's, and a file
// that does not read is an error at its field.
func TestReferenceSourceAndWebhookTLS(t *testing.T) {
	f := newFiles(t)
	doc := func(ca string) string {
		return fmt.Sprintf(`
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
reference_sets:
  loinc:
    source:
      http:
        url: https://terminology.example.net/loinc.csv
        tls: {ca_file: %q, cert_file: %q, key_file: %q}
alerts:
  sinks:
    ops:
      webhook:
        url: https://hooks.example.org/mefor
        tls: {ca_file: %q}
  rules: [{name: r, destination: out, queue_depth: 1, sinks: [ops]}]
`, f.caFile, f.clientCrt, f.clientKey, ca)
	}
	cfg, err := config.Parse("mefor.yaml", []byte(strings.TrimPrefix(doc(f.caFile), "\n")), nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range set.Certificates() {
		got[filepath.Base(c.File)] = strings.Join(c.Uses, ", ")
	}
	want := map[string]string{
		"ca.crt":     `reference set "loinc" CA, alert sink "ops" CA`,
		"client.crt": `reference set "loinc" client certificate`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("certificates:\n got %v\nwant %v", got, want)
	}
	ref, hook := set.ReferenceClient("loinc"), set.AlertSinkClient("ops")
	if ref == nil || hook == nil {
		t.Fatal("no configuration for the reference source or the webhook")
	}
	if c := ref.Config(); c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "terminology.example.net" {
		t.Errorf("reference source TLS: roots %v, %d certificates, server name %q", c.RootCAs != nil, len(c.Certificates), c.ServerName)
	}
	if c := hook.Config(); c.RootCAs == nil || c.ServerName != "hooks.example.org" {
		t.Errorf("webhook TLS: roots %v, server name %q", c.RootCAs != nil, c.ServerName)
	}
	if set.Client("loinc") != nil || set.AlertSinkClient("loinc") != nil {
		t.Error("a reference set's configuration is served under another kind's name")
	}

	missing := filepath.Join(f.dir, "missing.crt")
	cfg, err = config.Parse("mefor.yaml", []byte(strings.TrimPrefix(doc(missing), "\n")), nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(missing)
	_, err = tlsconf.New(cfg, time.Now())
	var errs config.Errors
	if !errors.As(err, &errs) || len(errs) != 1 {
		t.Fatalf("err = %v, want one problem", err)
	}
	if e := errs[0]; e.Line != 18 || e.Field != "alerts.sinks.ops.webhook.tls.ca_file" || !strings.Contains(e.Message, "cannot be read") {
		t.Errorf("got %v (line %d, field %s)", e, e.Line, e.Field)
	}
}
