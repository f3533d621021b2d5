package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/config"
)

// outboundDoc has one of each outbound connection; egress is the egress:
// section (line 1 onwards when given).
func outboundDoc(egress string) string {
	return egress + `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, hie]}]
destinations:
  lab:
    type: mllp
    mllp: {address: lab.example.org:2575, tls: {}}
  hie:
    type: http
    http: {url: "https://hie.example.org/hl7?token=s3cret"}
reference_sets:
  loinc:
    source:
      http:
        url: https://terminology.example.net/loinc.csv
        proxy: http://proxy.example.org:3128
        headers: {Authorization: "Bearer ${TERM_TOKEN}"}
  lims:
    source:
      sql: {database_url: "postgres://u:pw@10.20.0.5:5433/lims?sslmode=verify-full", query: "select 1, 2"}
  lims-b:
    source:
      sql: {database_url: "postgres://u:pw@lims-b.example.org/lims?sslmode=verify-full", query: "select 1, 2"}
alerts:
  sinks:
    ops: {webhook: {url: "https://hooks.example.org/mefor", tls: {ca_file: /etc/mefor/hooks-ca.crt}}}
  rules:
    - {name: backlog, destination: lab, queue_depth: 10, sinks: [ops]}
`
}

func TestEgressAllowsWhatIsListed(t *testing.T) {
	c, err := parse(t, outboundDoc(`
egress:
  allow:
    - lab.example.org:2575
    - hie.example.org
    - "*.example.net:443"
    - proxy.example.org:3128
    - 10.20.0.0/16
    - LIMS-B.example.org.
    - hooks.example.org:443`), map[string]string{"TERM_TOKEN": "t0ken"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Egress.Allow.Strings(), " "); !strings.Contains(got, "*.example.net:443") || len(c.Egress.Allow) != 7 {
		t.Fatalf("allow = %s", got)
	}
	var got []string
	for _, o := range c.Outbound() {
		got = append(got, o.Target+" "+o.Protocol+" "+o.Address())
		if o.Plaintext {
			t.Errorf("%s %s flagged as plaintext", o.Target, o.Address())
		}
	}
	want := []string{
		"destination:lab mllp lab.example.org:2575",
		"destination:hie https hie.example.org:443",
		"reference_set:loinc https terminology.example.net:443",
		"reference_set:loinc proxy proxy.example.org:3128",
		"reference_set:lims postgres 10.20.0.5:5433",
		"reference_set:lims-b postgres lims-b.example.org:5432",
		"alert_sink:ops https hooks.example.org:443",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("outbound:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	src := c.ReferenceSet("loinc").Source.HTTP
	if src.Proxy != "http://proxy.example.org:3128" || len(src.Headers) != 1 || src.Headers[0].Value != "Bearer t0ken" {
		t.Errorf("reference source: proxy %q, headers %+v", src.Proxy, src.Headers)
	}
	if w := c.Alerts.Sink("ops").Webhook; !w.TLS.Enabled || w.TLS.ServerName != "hooks.example.org" || w.TLS.CAFile != "/etc/mefor/hooks-ca.crt" {
		t.Errorf("webhook tls: %+v", w.TLS)
	}
	for _, w := range c.Warnings {
		if !strings.Contains(w.Message, "not used by any lookup") {
			t.Errorf("warning: %v", w)
		}
	}

	// Without an egress: section, everything goes.
	c, err = parse(t, outboundDoc(""), map[string]string{"TERM_TOKEN": "t0ken"})
	if err != nil || c.Egress != nil {
		t.Fatalf("no egress section: %v, %+v", err, c.Egress)
	}
}

// With egress: present the file is fail-closed: each connection outside
// the list is an error at the line that names it, saying what to add;
// a URL's path and query stay out of the message.
func TestEgressRefusesWhatIsNotListed(t *testing.T) {
	_, err := parse(t, outboundDoc(`
egress:
  allow: [10.30.0.0/16]`), map[string]string{"TERM_TOKEN": "t0ken"})
	checkErrs(t, err, []wantErr{
		{10, "destinations.lab.mllp.address", `lab.example.org:2575 is not in egress.allow, so mefor may not connect to it; add "lab.example.org:2575" (or "lab.example.org", or "*.example.org") to egress.allow, or correct the host; a CIDR allows addresses written as addresses, not names`},
		{13, "destinations.hie.http.url", `hie.example.org:443 is not in egress.allow`},
		{18, "reference_sets.loinc.source.http.url", `terminology.example.net:443 is not in egress.allow`},
		{19, "reference_sets.loinc.source.http.proxy", `the proxy proxy.example.org:3128 is not in egress.allow`},
		{23, "reference_sets.lims.source.sql.database_url", `10.20.0.5:5433 is not in egress.allow, so mefor may not connect to it; add "10.20.0.5:5433" (or a network holding it, e.g. "10.20.0.0/24")`},
		{26, "reference_sets.lims-b.source.sql.database_url", `lims-b.example.org:5432 is not in egress.allow`},
		{29, "alerts.sinks.ops.webhook.url", `hooks.example.org:443 is not in egress.allow`},
	})
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "pw@") {
		t.Errorf("an error shows a URL's query or password:\n%v", err)
	}
	if want := `test.yaml:10: destination "lab": mllp.address lab.example.org:2575 is not in egress.allow`; !strings.Contains(err.Error(), want) {
		t.Errorf("errors do not read %q:\n%v", want, err)
	}

	// An empty list allows nothing.
	_, err = parse(t, minimal+"egress: {allow: []}\n", nil)
	checkErrs(t, err, []wantErr{{10, "destinations.out.mllp.address", "127.0.0.1:2576 is not in egress.allow"}})
}

func TestEgressSectionErrors(t *testing.T) {
	_, err := parse(t, minimal+`egress: {}
`, nil)
	checkErrs(t, err, []wantErr{{11, "egress.allow", "is required"}})

	_, err = parse(t, minimal+`egress:
  allow:
    - 127.0.0.1:2576
    - lab example
    - 10.0.0.1/8
    - "*"
`, nil)
	// The bad entries, and nothing about the destination they might
	// have allowed.
	checkErrs(t, err, []wantErr{
		{14, "egress.allow[1]", `"lab example" is not a host name`},
		{15, "egress.allow[2]", `write 10.0.0.0/8`},
		{16, "egress.allow[3]", `every host`},
	})

	c, err := parse(t, minimal+`egress: {allow: [127.0.0.1, 0.0.0.0/0]}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Message, "every IPv4 address") {
		t.Errorf("warnings: %v", c.Warnings)
	}
}

// Outbound plaintext to another machine is a warning at the line that
// names it, unless the connection says plaintext: true; loopback is not
// flagged, and plaintext: true beside TLS is an error.
func TestOutboundPlaintextIsFlagged(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, local, hie, known]}]
destinations:
  lab: {type: mllp, mllp: {address: lab.example.org:2575}}
  local: {type: mllp, mllp: {address: "localhost:2576"}}
  hie: {type: http, http: {url: "http://10.1.2.3:8080/hl7"}}
  known: {type: mllp, mllp: {address: "10.1.2.4:2575", plaintext: true}}
reference_sets:
  codes: {source: {http: {url: "http://terminology.example.net/codes.csv"}}}
  local-codes: {source: {http: {url: "http://127.0.0.1:8080/codes.csv"}}}
  acknowledged: {source: {http: {url: "http://terminology.example.net/a.csv", plaintext: true}}}
alerts:
  sinks:
    ops: {webhook: {url: "http://hooks.example.org/mefor"}}
  rules: [{name: r, destination: lab, queue_depth: 1, sinks: [ops]}]
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings {
		if strings.Contains(w.Message, "plaintext") {
			got = append(got, w.Field)
		}
	}
	want := []string{"destinations.lab.mllp.address", "destinations.hie.http.url", "reference_sets.codes.source.http.url", "alerts.sinks.ops.webhook.url"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("plaintext warnings at %v, want %v\n%v", got, want, c.Warnings)
	}
	var flagged []string
	for _, o := range c.Outbound() {
		if o.Plaintext {
			flagged = append(flagged, o.Target)
		}
	}
	if strings.Join(flagged, " ") != "destination:lab destination:hie reference_set:codes alert_sink:ops" {
		t.Errorf("Outbound flags %v", flagged)
	}

	_, err = parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, hie]}]
destinations:
  lab: {type: mllp, mllp: {address: lab.example.org:2575, tls: {}, plaintext: true}}
  hie: {type: http, http: {url: "https://hie.example.org/hl7", plaintext: true}}
reference_sets:
  codes: {source: {http: {url: "https://t.example.net/c.csv", plaintext: true}}}
  tls-on-http: {source: {http: {url: "http://t.example.net/c.csv", tls: {}}}}
  bad-proxy: {source: {http: {url: "https://t.example.net/c.csv", proxy: "socks5://p:1080"}}}
`, nil)
	checkErrs(t, err, []wantErr{
		{6, "destinations.lab.mllp.plaintext", "a tls: block is set too"},
		{7, "destinations.hie.http.plaintext", "the url is https://"},
		{9, "reference_sets.codes.source.http.plaintext", "the url is https://"},
		{10, "reference_sets.tls-on-http.source.http.tls", "applies to https:// URLs only"},
		{11, "reference_sets.bad-proxy.source.http.proxy", "must be an http:// or https:// URL"},
	})
}

// A reference source's headers are checked like a destination's, and
// their values never appear in an error.
func TestReferenceSourceHeaders(t *testing.T) {
	_, err := parse(t, minimal+`reference_sets:
  codes:
    source:
      http:
        url: https://t.example.net/c.csv
        headers: {Host: x, Authorization: "Bearer ${TOKEN}"}
`, map[string]string{"TOKEN": "line\nbreak-s3cret"})
	var errs config.Errors
	if !errors.As(err, &errs) || len(errs) != 2 {
		t.Fatalf("want two problems, got %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("an error shows a header value: %v", err)
	}
}
