package tlsconf_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// files is a directory of certificates for one test: a CA, the listener's
// certificate and a client certificate, all signed by it.
type files struct {
	dir                  string
	ca                   *certtest.CA
	caFile               string
	serverCrt, serverKey string
	clientCrt, clientKey string
}

func newFiles(t *testing.T) *files {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "Test CA")
	f := &files{dir: dir, ca: ca, caFile: ca.WriteFile(t, dir, "ca.crt")}
	f.serverCrt, f.serverKey = ca.Issue(t, "mefor.test", certtest.Options{}).WriteFiles(t, dir, "server")
	f.clientCrt, f.clientKey = ca.Issue(t, "mefor-node", certtest.Options{}).WriteFiles(t, dir, "client")
	return f
}

// config uses every file: the listener's certificate, key and client CA,
// and the client certificate of destination lab.
func (f *files) config(t *testing.T) *config.Config {
	t.Helper()
	return listenerConfig(t, f.serverCrt, f.serverKey, f.caFile, "", fmt.Sprintf(`
    type: mllp
    mllp:
      address: localhost:2576
      tls: {ca_file: %q, cert_file: %q, key_file: %q}`, f.caFile, f.clientCrt, f.clientKey))
}

// listenerConfig is a config whose channel adt listens with TLS under cert
// and key, asking clients for a certificate of clientCA, with the further
// tls: settings more (whole lines); it routes to destination lab, whose
// definition follows "lab:".
func listenerConfig(t *testing.T, cert, key, clientCA, more, lab string) *config.Config {
	t.Helper()
	doc := fmt.Sprintf(`channels:
  adt:
    inbound:
      mllp:
        listen: 127.0.0.1:2575
        tls:
          cert_file: %q
          key_file: %q
          client_ca_file: %q
%s    routes: [{destinations: [lab]}]
destinations:
  lab:%s
`, cert, key, clientCA, more, lab)
	cfg, err := config.Parse("mefor.yaml", []byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestNewListsCertificatesInUse(t *testing.T) {
	f := newFiles(t)
	set, err := tlsconf.New(f.config(t), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range set.Certificates() {
		got[filepath.Base(c.File)] = c.Subject + " / " + strings.Join(c.Uses, ", ")
		if c.NotAfter.IsZero() {
			t.Errorf("%s: no expiry", c.File)
		}
	}
	want := map[string]string{
		"server.crt": `CN=mefor.test,O=mefor tests / channel "adt" server certificate`,
		"client.crt": `CN=mefor-node,O=mefor tests / destination "lab" client certificate`,
		"ca.crt":     `CN=Test CA,O=mefor tests / channel "adt" client CA, destination "lab" CA`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("certificates:\n got %v\nwant %v", got, want)
	}
	if set.Server("adt") == nil || set.Client("lab") == nil {
		t.Fatal("no configuration for the TLS channel or destination")
	}
	if set.Client("lab").Config().ServerName != "localhost" {
		t.Errorf("server name %q, want the address's host", set.Client("lab").Config().ServerName)
	}
}

// A node does not start with a certificate that cannot work, and says which
// one and why, in the config's own terms.
func TestNewRefusesUnusableFiles(t *testing.T) {
	for _, tt := range []struct {
		name  string
		spoil func(t *testing.T, f *files)
		line  int
		field string
		msg   string
	}{
		{
			name: "expired certificate",
			spoil: func(t *testing.T, f *files) {
				f.ca.Issue(t, "mefor.test", certtest.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}).
					WriteFiles(t, f.dir, "server")
			},
			line: 7, field: "channels.adt.inbound.mllp.tls.cert_file", msg: `certificate "CN=mefor.test,O=mefor tests" expired on`,
		},
		{
			name:  "missing file",
			spoil: func(t *testing.T, f *files) { os.Remove(f.clientKey) },
			line:  16, field: "destinations.lab.mllp.tls.key_file", msg: "cannot be read: no such file or directory",
		},
		{
			name: "key of another certificate",
			spoil: func(t *testing.T, f *files) {
				other := f.ca.Issue(t, "other", certtest.Options{})
				os.WriteFile(f.serverKey, other.KeyPEM, 0o600)
			},
			line: 8, field: "channels.adt.inbound.mllp.tls.key_file", msg: "is not the private key of the certificate in",
		},
		{
			name:  "not PEM",
			spoil: func(t *testing.T, f *files) { os.WriteFile(f.caFile, []byte("not a certificate\n"), 0o600) },
			line:  9, field: "channels.adt.inbound.mllp.tls.client_ca_file", msg: "holds no PEM certificate",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFiles(t)
			tt.spoil(t, f)
			_, err := tlsconf.New(f.config(t), time.Now())
			var errs config.Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("err = %v, want config.Errors", err)
			}
			e := errs[0]
			if e.File != "mefor.yaml" || e.Line != tt.line || e.Field != tt.field || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("got %v (line %d, field %s), want line %d, field %s, message containing %q", e, e.Line, e.Field, tt.line, tt.field, tt.msg)
			}
		})
	}
}

// HTTP reference sources and alert webhooks take the destinations' tls:
// block: their files are read and listed like a destination's, and a file
// that does not read is an error at its field.
func TestReferenceSourceAndWebhookTLS(t *testing.T) {
	f := newFiles(t)
	doc := func(ca string) string {
		return fmt.Sprintf(fixtures.ADTToFile+`reference_sets:
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

// crlConfig is a TLS listener of the openssl CA ca with crl_file crl.
func crlConfig(t *testing.T, ca *certtest.OpenSSLCA, server *certtest.FileCert, crl string) *config.Config {
	t.Helper()
	return listenerConfig(t, server.CertFile, server.KeyFile, ca.CertFile,
		fmt.Sprintf("          allow_names: [lab]\n          crl_file: %q\n", crl), " {type: mllp, mllp: {address: localhost:2576}}")
}

// A CRL the client CA signed is read and listed with the certificates,
// its next update as its expiry; the node warns about it only once that
// has passed, not within tls_expiry_warning as for a certificate.
func TestCRLListedAndWarnedWhenDue(t *testing.T) {
	ca := certtest.NewOpenSSLCA(t, "Partners CA")
	server := ca.Issue(t, "server", "mefor.test", "DNS:localhost")
	set, err := tlsconf.New(crlConfig(t, ca, server, ca.GenCRL(t)), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var crl *tlsconf.Certificate
	for _, c := range set.Certificates() {
		if c.CRL {
			crl = &c
		}
	}
	if crl == nil || crl.File != ca.CRLFile || !strings.Contains(crl.Subject, "Partners CA") || crl.Uses[0] != `channel "adt" CRL` {
		t.Fatalf("the CRL is listed as %+v", crl)
	}
	if left := time.Until(crl.NotAfter); left < 23*time.Hour || left > 25*time.Hour {
		t.Errorf("listed until %s, want its next update, a day from now (default_crl_days = 1)", crl.NotAfter)
	}

	var log bytes.Buffer
	w := &tlsconf.ExpiryWarner{Window: 30 * 24 * time.Hour, Logger: slog.New(slog.NewTextHandler(&log, nil))}
	if n := w.Check(context.Background(), []tlsconf.Certificate{*crl}, time.Now()); n != 0 {
		t.Errorf("warned about a CRL a day before its next update:\n%s", log.String())
	}
	if n := w.Check(context.Background(), []tlsconf.Certificate{*crl}, crl.NotAfter.Add(time.Hour)); n != 1 ||
		!strings.Contains(log.String(), "revocation list in use is due for its next update") {
		t.Errorf("no warning once the next update passed:\n%s", log.String())
	}
}

// A CRL that does not parse, or that another CA signed, refuses the start
// (and the reload) naming the field and the file: a list nobody can trust
// must not decide who is let in.
func TestCRLRefusedUnlessTheClientCASignedIt(t *testing.T) {
	ca := certtest.NewOpenSSLCA(t, "Partners CA")
	other := certtest.NewOpenSSLCA(t, "Someone else")
	server := ca.Issue(t, "server", "mefor.test", "DNS:localhost")
	junk := filepath.Join(t.TempDir(), "junk.crl")
	if err := os.WriteFile(junk, []byte("not a CRL"), 0o600); err != nil {
		t.Fatal(err)
	}
	for crl, want := range map[string]string{
		other.GenCRL(t): `is not signed by a CA in client_ca_file`,
		junk:            "does not parse",
		filepath.Join(t.TempDir(), "missing.crl"): "cannot be read",
	} {
		_, err := tlsconf.New(crlConfig(t, ca, server, crl), time.Now())
		if err == nil || !strings.Contains(err.Error(), `inbound.mllp.tls.crl_file`) || !strings.Contains(err.Error(), crl) ||
			!strings.Contains(err.Error(), want) {
			t.Errorf("crl_file %s: %v, want an error naming the field and file, saying %q", filepath.Base(crl), err, want)
		}
	}
}

// Renewed files at the same paths apply to new connections once committed,
// while a connection made before keeps working.
func TestRenewalAppliesToNewConnections(t *testing.T) {
	f := newFiles(t)
	cfg := f.config(t)
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := &mllp.Server{
		Handler:   mllp.HandlerFunc(func(_ context.Context, msg []byte, _ mllp.ConnInfo) []byte { return append([]byte("ACK|"), msg...) }),
		TLSConfig: set.Server("adt").TLSConfig(),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	// Connections as a partner makes them, recording the server's
	// certificate serial each one saw.
	seen := make(chan string, 4)
	newClient := func() *mllp.Client {
		clientTLS := &tls.Config{RootCAs: f.ca.Pool(), Certificates: []tls.Certificate{issueClient(t, f)},
			VerifyConnection: func(cs tls.ConnectionState) error {
				seen <- cs.PeerCertificates[0].SerialNumber.Text(16)
				return nil
			}}
		return &mllp.Client{Addr: ln.Addr().String(), Dialer: mllp.TLSDialer(func() *tls.Config { return clientTLS })}
	}
	old := newClient()
	defer old.Close()
	send(t, old, "MSH|1")
	before := <-seen

	renewed := f.ca.Issue(t, "mefor.test", certtest.Options{})
	renewed.WriteFiles(t, f.dir, "server")
	st, err := set.Prepare(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Commit(); len(got) != 2 || got[0] != f.serverCrt || got[1] != f.serverKey {
		t.Errorf("renewed = %v, want the server certificate and key", got)
	}

	send(t, old, "MSH|2") // the established connection carries on
	if len(seen) != 0 {
		t.Fatal("the established connection was re-established")
	}
	fresh := newClient()
	defer fresh.Close()
	send(t, fresh, "MSH|3")
	if after := <-seen; after == before || after != renewed.Leaf.SerialNumber.Text(16) {
		t.Fatalf("a new connection got serial %s, want the renewed certificate's %s (the old one was %s)",
			after, renewed.Leaf.SerialNumber.Text(16), before)
	}
	var listed bool
	for _, c := range set.Certificates() {
		listed = listed || c.Serial == renewed.Leaf.SerialNumber.Text(16)
	}
	if !listed {
		t.Error("the renewed certificate is not listed as in use")
	}
}

// A reload whose files do not check out changes nothing.
func TestFailedPrepareKeepsServing(t *testing.T) {
	f := newFiles(t)
	cfg := f.config(t)
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := set.Server("adt")
	beforeCert := before.TLSConfig()
	f.ca.Issue(t, "mefor.test", certtest.Options{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}).
		WriteFiles(t, f.dir, "server")
	if _, err := set.Prepare(cfg, time.Now()); err == nil {
		t.Fatal("Prepare accepted an expired certificate")
	}
	cur, _ := beforeCert.GetConfigForClient(nil)
	if cur.Certificates[0].Leaf.NotAfter.Before(time.Now()) {
		t.Fatal("the expired certificate went into use")
	}
}

func TestExpiryWarner(t *testing.T) {
	var buf bytes.Buffer
	w := &tlsconf.ExpiryWarner{Window: 30 * 24 * time.Hour, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	certs := []tlsconf.Certificate{
		{File: "soon.crt", Serial: "1", Subject: "CN=soon", NotAfter: now.Add(10 * 24 * time.Hour)},
		{File: "later.crt", Serial: "2", Subject: "CN=later", NotAfter: now.Add(40 * 24 * time.Hour)},
		{File: "gone.crt", Serial: "3", Subject: "CN=gone", NotAfter: now.Add(-time.Hour)},
	}
	ctx := context.Background()
	if n := w.Check(ctx, certs, now); n != 2 {
		t.Fatalf("warned about %d certificates, want 2 (soon and gone):\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "file=soon.crt") || !strings.Contains(buf.String(), "days_left=10") ||
		!strings.Contains(buf.String(), "level=ERROR") || strings.Contains(buf.String(), "later.crt") {
		t.Errorf("log:\n%s", buf.String())
	}
	if n := w.Check(ctx, certs, now.Add(23*time.Hour)); n != 0 {
		t.Fatalf("warned again %d times within the day", n)
	}
	if n := w.Check(ctx, certs, now.Add(24*time.Hour)); n != 2 {
		t.Fatalf("warned %d times a day later, want 2", n)
	}
	// Ten days later "later" is within the window too.
	if n := w.Check(ctx, certs, now.Add(11*24*time.Hour)); n != 3 {
		t.Fatalf("warned %d times eleven days later, want 3", n)
	}
}

func issueClient(t *testing.T, f *files) tls.Certificate {
	return f.ca.Issue(t, "partner", certtest.Options{}).TLS
}

func send(t *testing.T, c *mllp.Client, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.Send(ctx, []byte(msg))
	if err != nil {
		t.Fatalf("send %s: %v", msg, err)
	}
	if string(ack) != "ACK|"+msg {
		t.Fatalf("ack %q", ack)
	}
}
