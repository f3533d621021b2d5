package admission_test

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"testing"

	"github.com/mefor/mefor/internal/admission"
)

func cert(cn string, dns []string, uris ...string) *x509.Certificate {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns, SerialNumber: big.NewInt(7), RawIssuer: []byte("ca")}
	for _, u := range uris {
		pu, _ := url.Parse(u)
		c.URIs = append(c.URIs, pu)
	}
	return c
}

func TestNamesMatchCNAndSANs(t *testing.T) {
	n := admission.NewNames([]string{"registration", "lab.example.org", "spiffe://hospital/lab"})
	for _, tt := range []struct {
		c    *x509.Certificate
		want bool
	}{
		{cert("registration", nil), true},
		{cert("Registration", nil), false}, // a common name is compared as written
		{cert("x", []string{"LAB.example.org"}), true},
		{cert("x", []string{"other.example.org"}), false},
		{cert("x", nil, "spiffe://hospital/lab"), true},
		{cert("x", nil, "spiffe://hospital/lab2"), false},
		{cert("", nil), false},
	} {
		if got := n.Match(tt.c); got != tt.want {
			t.Errorf("Match(%v) = %v, want %v", admission.CertNames(tt.c), got, tt.want)
		}
	}
}

func TestPeerCheckRefusesByNameAndRevocation(t *testing.T) {
	root := cert("root", nil)
	revoked := cert("revoked", nil)
	revoked.SerialNumber = big.NewInt(99)
	p := &admission.PeerCheck{
		Names: admission.NewNames([]string{"good", "revoked"}),
		Revoked: admission.NewRevocations([]*x509.RevocationList{{RawIssuer: []byte("ca"),
			RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(99)}}}}),
	}
	state := func(leaf *x509.Certificate) tls.ConnectionState {
		return tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf, root}}}
	}
	if err := p.VerifyConnection(state(cert("good", nil))); err != nil {
		t.Errorf("good: %v", err)
	}
	var r *admission.Refusal
	if err := p.VerifyConnection(state(cert("stranger", nil))); !errors.As(err, &r) || r.Reason != admission.TLSName {
		t.Errorf("stranger: %v, want refused with tls_name", err)
	}
	if err := p.VerifyConnection(state(revoked)); !errors.As(err, &r) || r.Reason != admission.TLSRevoked {
		t.Errorf("revoked: %v, want refused with tls_revoked", err)
	}
	if err := p.VerifyConnection(tls.ConnectionState{}); err != nil {
		t.Errorf("no verified certificate: %v, want nothing to check", err)
	}
}
