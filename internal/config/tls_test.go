package config_test

import (
	"crypto/tls"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

func TestParseTLS(t *testing.T) {
	c, err := parse(t, `
tls_expiry_warning: 14d
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        tls:
          cert_file: /etc/mefor/tls/server.crt
          key_file: /etc/mefor/tls/server.key
          client_ca_file: /etc/mefor/tls/partners-ca.crt
          allow_names: [lab.example.org, registration]
          crl_file: /etc/mefor/tls/partners.crl
    routes: [{destinations: [lab, emr]}]
destinations:
  lab:
    type: mllp
    mllp:
      address: lab.example.org:2576
      tls:
        ca_file: /etc/mefor/tls/lab-ca.crt
        cert_file: /etc/mefor/tls/client.crt
        key_file: /etc/mefor/tls/client.key
        min_version: "1.3"
  emr:
    type: mllp
    mllp:
      address: 10.0.0.7:2576
      tls: {server_name: emr.example.org}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", config.Errors(c.Warnings))
	}
	if c.TLSExpiryWarning != 14*24*time.Hour {
		t.Errorf("tls_expiry_warning = %v", c.TLSExpiryWarning)
	}
	in := c.Channel("adt").Inbound.MLLP.TLS
	want := config.ServerTLS{Enabled: true, CertFile: "/etc/mefor/tls/server.crt", KeyFile: "/etc/mefor/tls/server.key",
		ClientCAFile: "/etc/mefor/tls/partners-ca.crt", AllowNames: []string{"lab.example.org", "registration"},
		CRLFile: "/etc/mefor/tls/partners.crl", MinVersion: tls.VersionTLS12}
	if !reflect.DeepEqual(in, want) {
		t.Errorf("inbound tls = %+v, want %+v", in, want)
	}
	lab := c.Destination("lab").MLLP.TLS
	wantLab := config.ClientTLS{Enabled: true, CAFile: "/etc/mefor/tls/lab-ca.crt", ServerName: "lab.example.org",
		CertFile: "/etc/mefor/tls/client.crt", KeyFile: "/etc/mefor/tls/client.key", MinVersion: tls.VersionTLS13}
	if lab != wantLab {
		t.Errorf("lab tls = %+v, want %+v (server_name defaults to the address's host)", lab, wantLab)
	}
	emr := c.Destination("emr").MLLP.TLS
	if !emr.Enabled || emr.ServerName != "emr.example.org" || emr.CAFile != "" || emr.MinVersion != tls.VersionTLS12 {
		t.Errorf("emr tls = %+v", emr)
	}
}

func TestParseNoTLS(t *testing.T) {
	c, err := parse(t, minimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Channel("adt").Inbound.MLLP.TLS.Enabled || c.Destination("out").MLLP.TLS.Enabled {
		t.Error("TLS enabled without a tls: block")
	}
	if c.TLSExpiryWarning != 30*24*time.Hour {
		t.Errorf("default tls_expiry_warning = %v, want 30 days", c.TLSExpiryWarning)
	}
}

func TestTLSValidation(t *testing.T) {
	checkInvalid(t, "", []invalid{
		{
			name: "insecure_skip_verify",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab]}]
destinations:
  lab:
    type: mllp
    mllp:
      address: lab:2576
      tls: {insecure_skip_verify: true}
`,
			want: []wantErr{{10, "destinations.lab.mllp.tls.insecure_skip_verify", "does not exist in mefor: a peer's certificate is always verified"}},
		},
		{
			name: "inbound needs cert and key",
			doc: `
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        tls: {client_ca_file: ca.crt}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{
				{6, "channels.adt.inbound.mllp.tls.cert_file", "is required: the listener's certificate"},
				{6, "channels.adt.inbound.mllp.tls.key_file", "is required: the certificate's private key"},
			},
		},
		{
			name: "allow_names and crl_file without client_ca_file",
			doc: `
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        tls: {cert_file: s.crt, key_file: s.key, allow_names: [lab], crl_file: ca.crl}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{
				{6, "channels.adt.inbound.mllp.tls.allow_names", "needs client_ca_file: without client certificates there is no name to check"},
				{6, "channels.adt.inbound.mllp.tls.crl_file", "needs client_ca_file"},
			},
		},
		{
			name: "allow_names empty",
			doc: `
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        tls:
          cert_file: s.crt
          key_file: s.key
          client_ca_file: ca.crt
          allow_names: []
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{{10, "channels.adt.inbound.mllp.tls.allow_names", "is empty, so no certificate could send"}},
		},
		{
			name: "plaintext and tls",
			doc: `
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        plaintext: true
        tls: {cert_file: s.crt, key_file: s.key}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{{6, "channels.adt.inbound.mllp.plaintext", "a tls: block is set too"}},
		},
		{
			name: "old and unknown versions",
			doc: `
channels:
  adt:
    inbound:
      mllp:
        listen: 127.0.0.1:2575
        tls: {cert_file: s.crt, key_file: s.key, min_version: "1.0"}
    routes: [{destinations: [out]}]
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576, tls: {min_version: "2"}}
`,
			want: []wantErr{
				{6, "channels.adt.inbound.mllp.tls.min_version", "TLS 1.0 and 1.1 are deprecated"},
				{11, "destinations.out.mllp.tls.min_version", `"2" is not a TLS version`},
			},
		},
		{
			name: "client key without certificate",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576, tls: {key_file: c.key}}
`,
			want: []wantErr{{8, "destinations.out.mllp.tls.cert_file", "is required with key_file"}},
		},
		{
			name: "expiry warning",
			doc: `
tls_expiry_warning: 0d
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{{1, "tls_expiry_warning", "must be > 0"}},
		},
	})
}

// A plaintext listener others can reach is refused, unless the file says
// it is meant; a TLS listener others can reach that asks for no client
// certificate is flagged.
func TestPlaintextExposure(t *testing.T) {
	doc := func(listen, extra string) string {
		return `
channels:
  adt:
    inbound:
      mllp:
        listen: "` + listen + `"` + extra + `
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`
	}
	const tlsNoClient = "\n        tls: {cert_file: s.crt, key_file: s.key}"
	for _, tt := range []struct {
		listen, extra string
		refused       bool
		flagged       bool
	}{
		{listen: "0.0.0.0:2575", refused: true},
		{listen: ":2575", refused: true},
		{listen: "[::]:2575", refused: true},
		{listen: "10.1.2.3:2575", refused: true},
		{listen: "mefor.example.org:2575", refused: true},
		{listen: "0.0.0.0:2575", extra: "\n        plaintext: true"},
		{listen: "127.0.0.1:2575"},
		{listen: "127.0.0.2:2575"},
		{listen: "[::1]:2575"},
		{listen: "localhost:2575"},
		{listen: "0.0.0.0:2575", extra: tlsNoClient, flagged: true},
		{listen: "127.0.0.1:2575", extra: tlsNoClient},
		{listen: "0.0.0.0:2575", extra: "\n        tls: {cert_file: s.crt, key_file: s.key, client_ca_file: ca.crt}"},
	} {
		c, err := parse(t, doc(tt.listen, tt.extra), nil)
		if tt.refused {
			checkErrs(t, err, []wantErr{{5, "channels.adt.inbound.mllp.listen", "would accept plaintext MLLP from the network"}})
			if err != nil && !strings.Contains(err.Error(), "set plaintext: true on this listener") {
				t.Errorf("%s: the error does not say how to allow it: %v", tt.listen, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s%s: %v", tt.listen, tt.extra, err)
		}
		if !tt.flagged {
			if len(c.Warnings) != 0 {
				t.Errorf("%s%s: unexpected warnings %v", tt.listen, tt.extra, config.Errors(c.Warnings))
			}
			continue
		}
		checkErrs(t, config.Errors(c.Warnings), []wantErr{{6, "channels.adt.inbound.mllp.tls", "accepts TLS from any client, without a certificate"}})
	}
}

func TestProblemIsLocated(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound:
      mllp:
        listen: 127.0.0.1:2575
        tls:
          cert_file: s.crt
          key_file: s.key
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576, tls: {}}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := c.Problem("channels", "adt", "inbound.mllp.tls.cert_file", "has expired")
	if e.Error() != `test.yaml:7: channel "adt": inbound.mllp.tls.cert_file has expired` {
		t.Errorf("got %q", e.Error())
	}
	// A key left to its default is reported where its block is.
	e = c.Problem("destinations", "out", "mllp.tls.ca_file", "x")
	if e.Line != 11 || e.Field != "destinations.out.mllp.tls.ca_file" {
		t.Errorf("got line %d field %q", e.Line, e.Field)
	}
}

func TestTLSExample(t *testing.T) {
	c, err := config.Load("../../examples/tls/mefor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) > 0 {
		t.Errorf("warnings: %v", config.Errors(c.Warnings))
	}
	in, out := c.Channel("adt").Inbound.MLLP.TLS, c.Destination("lab").MLLP.TLS
	if !in.Enabled || in.ClientCAFile == "" || !out.Enabled || out.CAFile == "" || out.CertFile == "" {
		t.Errorf("the example no longer shows mutual TLS both ways: inbound %+v, outbound %+v", in, out)
	}
}
