package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ServerTLS is an MLLP listener's TLS settings. The zero value (Enabled
// false) is a plaintext listener. Only file names are held here: the files
// are read when a node starts or reloads (package tlsconf), never by Load,
// so `mefor config check` and `mefor reload` work where the key files are
// not readable.
//
// A reload that leaves it equal keeps the listener and its connections,
// and renewed files at the same paths (a CRL included) are picked up for
// new handshakes.
type ServerTLS struct {
	Enabled bool
	// CertFile holds the listener's certificate (PEM), followed by any
	// intermediate certificates to send with it.
	CertFile string
	// KeyFile holds the certificate's private key (PEM).
	KeyFile string
	// ClientCAFile, when set, makes the listener require a client
	// certificate signed by one of the CAs in this PEM file; a sender
	// without one is refused during the handshake.
	ClientCAFile string
	// AllowNames, when set, are the client certificate names accepted: a
	// certificate the client CAs signed is refused during the handshake
	// unless its common name, one of its DNS names or one of its URIs is
	// in the list. Requires ClientCAFile.
	AllowNames []string
	// CRLFile, when set, is a certificate revocation list (PEM or DER)
	// from a CA of ClientCAFile: a client certificate it lists is refused
	// during the handshake. It is read again at each reload. Requires
	// ClientCAFile.
	CRLFile string
	// MinVersion is the oldest TLS version accepted. Defaults to TLS 1.2.
	MinVersion uint16
}

// ClientTLS is an MLLP destination's TLS settings. The zero value (Enabled
// false) connects in plaintext. Like ServerTLS it holds file names only and
// is comparable.
type ClientTLS struct {
	Enabled bool
	// CAFile holds the CAs the partner's certificate must chain to (PEM).
	// Empty means the system's roots.
	CAFile string
	// ServerName is the name the partner's certificate must carry.
	// Defaults to the host of the destination's address.
	ServerName string
	// CertFile and KeyFile, when set, are the client certificate presented
	// to a partner that asks for one.
	CertFile, KeyFile string
	// MinVersion is the oldest TLS version accepted. Defaults to TLS 1.2.
	MinVersion uint16
}

// defaultTLSExpiryWarning is how long before a certificate expires a node
// starts warning about it, once a day.
const defaultTLSExpiryWarning = 30 * 24 * time.Hour

// refusedKeys are keys that some other tools accept and mefor deliberately
// does not, with why and what to do instead. They are refused wherever they
// are written.
var refusedKeys = map[string]string{
	"insecure_skip_verify": "does not exist in mefor: a peer's certificate is always verified, because an unverified " +
		"connection can be intercepted and read; to trust a private CA, name it in ca_file (outbound) or client_ca_file (inbound)",
}

func (l *loader) decodeServerTLS(n *yaml.Node, p path) ServerTLS {
	t := ServerTLS{Enabled: true, MinVersion: tls.VersionTLS12}
	m := l.mapping(n, p, "cert_file", "key_file", "client_ca_file", "allow_names", "crl_file", "min_version")
	decodeScalar(l, m, p, "cert_file", &t.CertFile, asString)
	decodeScalar(l, m, p, "key_file", &t.KeyFile, asString)
	decodeScalar(l, m, p, "client_ca_file", &t.ClientCAFile, asString)
	l.strings(m, p, "allow_names", &t.AllowNames)
	decodeScalar(l, m, p, "crl_file", &t.CRLFile, asString)
	decodeScalar(l, m, p, "min_version", &t.MinVersion, parseTLSVersion)
	return t
}

func (l *loader) decodeClientTLS(n *yaml.Node, p path) ClientTLS {
	t := ClientTLS{Enabled: true, MinVersion: tls.VersionTLS12}
	m := l.mapping(n, p, "ca_file", "server_name", "cert_file", "key_file", "min_version")
	decodeScalar(l, m, p, "ca_file", &t.CAFile, asString)
	decodeScalar(l, m, p, "server_name", &t.ServerName, asString)
	decodeScalar(l, m, p, "cert_file", &t.CertFile, asString)
	decodeScalar(l, m, p, "key_file", &t.KeyFile, asString)
	decodeScalar(l, m, p, "min_version", &t.MinVersion, parseTLSVersion)
	return t
}

// parseTLSVersion reads "1.2" or "1.3". Older versions are refused: they
// are deprecated (RFC 8996) and Go no longer offers them by default.
func parseTLSVersion(s string) (uint16, error) {
	switch strings.TrimPrefix(strings.ToLower(s), "tls") {
	case "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	case "1.0", "1", "1.1":
		return 0, fmt.Errorf("%q is not allowed: TLS 1.0 and 1.1 are deprecated (RFC 8996); use \"1.2\" (the default) or \"1.3\"", s)
	}
	return 0, fmt.Errorf("%q is not a TLS version; use \"1.2\" (the default) or \"1.3\"", s)
}

// checkInboundTLS checks a listener's tls: block, refuses a plaintext
// listener reachable from the network unless it says plaintext: true, and
// flags a TLS listener that lets in any client.
func (l *loader) checkInboundTLS(in *MLLPInbound, p path) {
	tp := p.key("tls")
	lp := p.key("listen")
	exposed := l.given(lp) && !l.failed(lp) && in.Exposed()
	if in.TLS.Enabled {
		if in.Plaintext && !l.failed(p.key("plaintext")) {
			l.errorf(p.key("plaintext"), "is true but a tls: block is set too; remove plaintext: true to serve TLS, or the tls: block to serve plaintext")
		}
		if in.TLS.CertFile == "" {
			l.errorf(tp.key("cert_file"), "is required: the listener's certificate, PEM (e.g. cert_file: /etc/mefor/tls/server.crt)")
		}
		if in.TLS.KeyFile == "" {
			l.errorf(tp.key("key_file"), "is required: the certificate's private key, PEM (e.g. key_file: /etc/mefor/tls/server.key)")
		}
		l.checkClientCertChecks(&in.TLS, tp)
		if exposed && in.TLS.ClientCAFile == "" {
			l.warnf(tp, "accepts TLS from any client, without a certificate: anyone who reaches %s may send; "+
				"add client_ca_file to require client certificates from your partners' CA (and allow_names to name them)", in.Listen)
		}
		return
	}
	if in.Plaintext || !exposed {
		return
	}
	if _, _, err := net.SplitHostPort(in.Listen); err == nil {
		l.errorf(lp, "%s would accept plaintext MLLP from the network, where anyone on the path can read the messages; "+
			"add a tls: block (cert_file, key_file, and client_ca_file to require client certificates), "+
			"listen on a loopback address (127.0.0.1), or set plaintext: true on this listener to allow plaintext on a trusted network", in.Listen)
	}
}

// checkClientCertChecks checks allow_names and crl_file, which refine the
// check of client certificates and so need client_ca_file.
func (l *loader) checkClientCertChecks(t *ServerTLS, tp path) {
	np := tp.key("allow_names")
	if l.given(np) && !l.failed(np) {
		switch {
		case t.ClientCAFile == "":
			l.errorf(np, "needs client_ca_file: without client certificates there is no name to check; "+
				"add client_ca_file (the CA that signs your partners' certificates), or remove allow_names")
		case len(t.AllowNames) == 0:
			l.errorf(np, "is empty, so no certificate could send; list the partners' certificate names "+
				"(common name, DNS or URI name, e.g. allow_names: [lab.example.org]), or remove allow_names to accept any certificate client_ca_file's CAs signed")
		}
		for i, name := range t.AllowNames {
			if strings.TrimSpace(name) == "" {
				l.errorf(np.index(i), "is empty; write a certificate's common name, DNS name or URI (e.g. lab.example.org)")
			}
		}
	}
	cp := tp.key("crl_file")
	if l.given(cp) && !l.failed(cp) {
		switch {
		case t.ClientCAFile == "":
			l.errorf(cp, "needs client_ca_file: a revocation list checks client certificates, which only client_ca_file asks for; "+
				"add client_ca_file (the CA that issued the CRL), or remove crl_file")
		case t.CRLFile == "":
			l.errorf(cp, "is empty; give the path of the CA's certificate revocation list, PEM or DER (e.g. crl_file: /etc/mefor/tls/partners.crl)")
		}
	}
}

// checkOutboundTLS checks a destination's tls: block and fills in the
// server name from the address.
func (l *loader) checkOutboundTLS(d *MLLPDestination, p path) {
	if d.TLS.Enabled && d.Plaintext && !l.failed(p.key("plaintext")) {
		l.errorf(p.key("plaintext"), "is true but a tls: block is set too; remove plaintext: true to connect over TLS, or the tls: block to connect in plaintext")
	}
	host := ""
	if h, _, err := net.SplitHostPort(d.Address); err == nil {
		host = h
	}
	l.checkClientTLS(&d.TLS, host, p)
}

// checkClientTLS checks a destination's tls: block (under p) and fills in
// the server name from host, the host the destination connects to.
func (l *loader) checkClientTLS(t *ClientTLS, host string, p path) {
	if !t.Enabled {
		return
	}
	tp := p.key("tls")
	cert, key := tp.key("cert_file"), tp.key("key_file")
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		l.errorf(key, "is required with cert_file: the client certificate's private key, PEM")
	case t.KeyFile != "" && t.CertFile == "":
		l.errorf(cert, "is required with key_file: the client certificate, PEM")
	}
	if t.ServerName == "" {
		t.ServerName = host
	}
}

// Exposed reports whether the listener accepts connections from other
// machines. Only localhost and loopback addresses are private; a wildcard
// (empty, 0.0.0.0, ::) or any other address or name counts as reachable
// from the network.
func (in *MLLPInbound) Exposed() bool {
	host, _, err := net.SplitHostPort(in.Listen)
	if err != nil {
		host = in.Listen
	}
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

func (l *loader) checkTLSExpiryWarning(c *Config) {
	p := path{section: "tls_expiry_warning"}
	if l.given(p) && !l.failed(p) && c.TLSExpiryWarning <= 0 {
		l.errorf(p, "must be > 0: how long before a certificate expires to start warning, once a day (e.g. tls_expiry_warning: 30d)")
	}
}

// Problem builds an Error about a field of a named entity (section is
// channels or destinations, rel a key path below it such as
// inbound.mllp.tls.cert_file), or of a section when name is empty (alerts,
// sinks.ops.webhook.tls.ca_file), located like a loading error. It is for
// problems found after loading, such as a certificate file that does not
// read or has expired.
func (c *Config) Problem(section, name, rel, format string, args ...any) Error {
	p := path{section: section, named: name != "", name: name, rel: rel}
	at := position{line: 1, column: 1}
	for q := p; ; {
		if pos, ok := c.pos[q]; ok {
			at = pos
			break
		}
		var ok bool
		if q, ok = q.parent(); !ok {
			break
		}
	}
	return Error{File: c.File, Line: at.line, Field: p.String(), Message: fmt.Sprintf(format, args...),
		prefix: p.prefix(), column: at.column}
}
