package certtest_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"

	"github.com/mefor/mefor/internal/certtest"
)

// The openssl CA issues certificates Go verifies, with the names asked
// for, and publishes a CRL, signed by the CA, listing what it revoked.
func TestOpenSSLCA(t *testing.T) {
	ca := certtest.NewOpenSSLCA(t, "Partners CA")
	good := ca.Issue(t, "good", "lab", "DNS:lab.example.org", "URI:spiffe://hospital/lab")
	bad := ca.Issue(t, "bad", "stolen")
	ca.Revoke(t, bad)
	crlPEM, err := os.ReadFile(ca.GenCRL(t))
	if err != nil {
		t.Fatal(err)
	}

	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	if _, err := good.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the issued certificate does not verify: %v", err)
	}
	if good.Leaf.Subject.CommonName != "lab" || len(good.Leaf.DNSNames) != 1 || len(good.Leaf.URIs) != 1 {
		t.Errorf("issued CN %q, DNS %v, URIs %v", good.Leaf.Subject.CommonName, good.Leaf.DNSNames, good.Leaf.URIs)
	}

	block, _ = pem.Decode(crlPEM)
	if block == nil || block.Type != "X509 CRL" {
		t.Fatalf("the CRL file is not a PEM X509 CRL:\n%s", crlPEM)
	}
	crl, err := x509.ParseRevocationList(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := crl.CheckSignatureFrom(caCert); err != nil {
		t.Fatalf("the CRL is not signed by the CA: %v", err)
	}
	if len(crl.RevokedCertificateEntries) != 1 || crl.RevokedCertificateEntries[0].SerialNumber.Cmp(bad.Leaf.SerialNumber) != 0 {
		t.Errorf("the CRL revokes %v, want only serial %v", crl.RevokedCertificateEntries, bad.Leaf.SerialNumber)
	}
}
