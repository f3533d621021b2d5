// Package certtest makes short-lived certificates for tests: a CA, and
// server and client certificates it signs, as Go values and as PEM files.
// Nothing here is meant for production: keys are written unencrypted, and
// every certificate expires within hours unless a test asks otherwise.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Lifetime is how long certificates are valid unless Options say otherwise.
const Lifetime = 2 * time.Hour

// CA is a certificate authority that signs test certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// NewCA makes a self-signed CA called name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"mefor tests"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pemBlock("CERTIFICATE", der)}
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteFile writes the CA certificate to dir/name and returns the path.
func (ca *CA) WriteFile(t testing.TB, dir, name string) string {
	t.Helper()
	return writeFile(t, filepath.Join(dir, name), ca.PEM)
}

// Options shape an issued certificate. The zero value is a certificate for
// both server and client use, valid from an hour ago for Lifetime, for
// localhost and 127.0.0.1.
type Options struct {
	NotBefore, NotAfter time.Time
	// DNSNames and IPs replace the default localhost and 127.0.0.1.
	DNSNames []string
	IPs      []net.IP
}

// Cert is an issued certificate with its key.
type Cert struct {
	Leaf    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
	TLS     tls.Certificate
}

// Issue signs a certificate for commonName.
func (ca *CA) Issue(t testing.TB, commonName string, opts Options) *Cert {
	t.Helper()
	now := time.Now()
	if opts.NotBefore.IsZero() {
		opts.NotBefore = now.Add(-time.Hour)
	}
	if opts.NotAfter.IsZero() {
		opts.NotAfter = now.Add(Lifetime)
	}
	if opts.DNSNames == nil && opts.IPs == nil {
		opts.DNSNames = []string{"localhost"}
		opts.IPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"mefor tests"}},
		NotBefore:    opts.NotBefore,
		NotAfter:     opts.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     opts.DNSNames,
		IPAddresses:  opts.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cert{Leaf: leaf, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", kder)}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteFiles writes the certificate to dir/base.crt and its key to
// dir/base.key and returns both paths.
func (c *Cert) WriteFiles(t testing.TB, dir, base string) (certFile, keyFile string) {
	t.Helper()
	return writeFile(t, filepath.Join(dir, base+".crt"), c.CertPEM),
		writeFile(t, filepath.Join(dir, base+".key"), c.KeyPEM)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// writeFile writes data through a rename, so a reader sees the old file or
// the new one, as a certificate renewal tool does.
func writeFile(t testing.TB, path string, data []byte) string {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}
