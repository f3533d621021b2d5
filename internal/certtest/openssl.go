package certtest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// OpenSSLCA is a certificate authority run with the openssl command line,
// as an operator runs one: `openssl ca` issues, revokes and publishes its
// certificate revocation list. Tests of certificate names and revocation
// use it so that what mefor accepts is what a real CA makes, not only
// what Go's x509 package makes.
type OpenSSLCA struct {
	// Dir holds the CA's files.
	Dir string
	// CertFile is the CA certificate (PEM).
	CertFile string
	// CRLFile is where GenCRL writes the revocation list (PEM).
	CRLFile string
	config  string
}

// FileCert is a certificate issued to files.
type FileCert struct {
	*Cert
	CertFile, KeyFile string
}

// NewOpenSSLCA makes a CA called name in a directory of its own. It fails
// the test when openssl is not installed.
func NewOpenSSLCA(t testing.TB, name string) *OpenSSLCA {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("these tests make their certificates with the openssl command, which is not on the PATH: %v", err)
	}
	dir := t.TempDir()
	ca := &OpenSSLCA{Dir: dir, CertFile: filepath.Join(dir, "ca.crt"), CRLFile: filepath.Join(dir, "ca.crl"),
		config: filepath.Join(dir, "ca.cnf")}
	for file, content := range map[string]string{
		"index.txt": "",
		"serial":    "1000\n",
		"crlnumber": "01\n",
		"ca.cnf": `[ca]
default_ca = test_ca

[test_ca]
dir = ` + dir + `
database = $dir/index.txt
serial = $dir/serial
crlnumber = $dir/crlnumber
new_certs_dir = $dir
certificate = $dir/ca.crt
private_key = $dir/ca.key
default_md = sha256
default_crl_days = 1
policy = any
copy_extensions = none
unique_subject = no

[any]
commonName = supplied
organizationName = optional
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca.openssl(t, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", filepath.Join(dir, "ca.key"), "-out", ca.CertFile, "-days", "2",
		"-subj", "/O=mefor tests/CN="+name,
		"-addext", "basicConstraints=critical,CA:TRUE",
		"-addext", "keyUsage=critical,keyCertSign,cRLSign")
	return ca
}

// Issue signs a certificate for commonName, valid from an hour ago for a
// day, for both server and client use. sans are subjectAltName entries
// in openssl's form (DNS:lab.example.org, URI:spiffe://hospital/lab,
// IP:127.0.0.1); none gives the certificate no alternative names. Its
// files are name.crt and name.key in the CA's directory.
func (ca *OpenSSLCA) Issue(t testing.TB, name, commonName string, sans ...string) *FileCert {
	t.Helper()
	key, csr := filepath.Join(ca.Dir, name+".key"), filepath.Join(ca.Dir, name+".csr")
	crt := filepath.Join(ca.Dir, name+".crt")
	ca.openssl(t, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", key, "-out", csr, "-subj", "/O=mefor tests/CN="+commonName)
	ext := filepath.Join(ca.Dir, name+".ext")
	extra := ""
	if len(sans) > 0 {
		extra = "subjectAltName = " + strings.Join(sans, ", ") + "\n"
	}
	if err := os.WriteFile(ext, []byte("[leaf]\n"+leafExtensions+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Hour).UTC().Format("20060102150405Z")
	end := time.Now().Add(24 * time.Hour).UTC().Format("20060102150405Z")
	ca.openssl(t, "ca", "-batch", "-config", ca.config, "-in", csr, "-out", crt, "-notext",
		"-extfile", ext, "-extensions", "leaf", "-startdate", start, "-enddate", end)
	certPEM, err := os.ReadFile(crt)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("openssl's certificate %s does not load: %v", crt, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return &FileCert{Cert: &Cert{Leaf: leaf, CertPEM: certPEM, KeyPEM: keyPEM, TLS: pair}, CertFile: crt, KeyFile: key}
}

const leafExtensions = `basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`

// Revoke marks c revoked in the CA's database; GenCRL publishes it.
func (ca *OpenSSLCA) Revoke(t testing.TB, c *FileCert) {
	t.Helper()
	ca.openssl(t, "ca", "-config", ca.config, "-revoke", c.CertFile, "-crl_reason", "keyCompromise")
}

// GenCRL writes the CA's current revocation list to CRLFile, through a
// rename, as a CRL distribution job does.
func (ca *OpenSSLCA) GenCRL(t testing.TB) string {
	t.Helper()
	tmp := ca.CRLFile + ".tmp"
	ca.openssl(t, "ca", "-config", ca.config, "-gencrl", "-out", tmp)
	if err := os.Rename(tmp, ca.CRLFile); err != nil {
		t.Fatal(err)
	}
	return ca.CRLFile
}

func (ca *OpenSSLCA) openssl(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = ca.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatal(fmt.Sprintf("openssl %s: %v\n%s", strings.Join(args, " "), err, out))
	}
}
