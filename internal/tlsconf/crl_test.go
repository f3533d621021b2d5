package tlsconf_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/tlsconf"
)

// crlConfig is a TLS listener of the openssl CA ca with crl_file crl.
func crlConfig(t *testing.T, ca *certtest.OpenSSLCA, server *certtest.FileCert, crl string) *config.Config {
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
          allow_names: [lab]
          crl_file: %q
    routes: [{destinations: [lab]}]
destinations:
  lab: {type: mllp, mllp: {address: localhost:2576}}
`, server.CertFile, server.KeyFile, ca.CertFile, crl)
	cfg, err := config.Parse("mefor.yaml", []byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
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
