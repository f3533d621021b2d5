package admission

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
)

// PeerCheck refuses client certificates that verified against the
// listener's client CAs but are not to be let in: none of their names is
// allowed, or they are revoked. Its VerifyConnection goes in the
// listener's tls.Config, so a refused certificate fails the handshake,
// before any frame is read.
type PeerCheck struct {
	// Names, when not nil, are the certificate names accepted.
	Names *Names
	// Revoked, when not nil, lists the revoked certificates.
	Revoked *Revocations
}

// Refusal is a client certificate a PeerCheck refused. It names the
// certificate by its subject, never by anything the sender sent after the
// handshake (there is nothing yet).
type Refusal struct {
	Reason  Reason
	Subject string
	// Detail says why, for the log.
	Detail string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("client certificate %q refused: %s", r.Subject, r.Detail)
}

// VerifyConnection implements tls.Config.VerifyConnection. It checks the
// verified chains only: without a verified client certificate (a listener
// without client CAs) there is nothing to check.
func (p *PeerCheck) VerifyConnection(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := cs.VerifiedChains[0][0]
	if p.Revoked != nil {
		for _, chain := range cs.VerifiedChains {
			// The last certificate of a chain is a trusted root, which no
			// CRL it signs can revoke.
			for _, c := range chain[:max(len(chain)-1, 1)] {
				if p.Revoked.Revoked(c) {
					detail := "it is listed in crl_file"
					if c != leaf {
						detail = fmt.Sprintf("its issuer %q is listed in crl_file", c.Subject.String())
					}
					return &Refusal{Reason: TLSRevoked, Subject: leaf.Subject.String(), Detail: detail}
				}
			}
		}
	}
	if p.Names != nil && !p.Names.Match(leaf) {
		return &Refusal{Reason: TLSName, Subject: leaf.Subject.String(),
			Detail: fmt.Sprintf("none of its names (%s) is in allow_names", strings.Join(CertNames(leaf), ", "))}
	}
	return nil
}

// Names is the set of client certificate names a listener accepts.
type Names struct {
	exact map[string]bool // common names and URIs, as written
	dns   map[string]bool // DNS names, lower case
}

// NewNames builds the set from a listener's allow_names.
func NewNames(names []string) *Names {
	n := &Names{exact: map[string]bool{}, dns: map[string]bool{}}
	for _, s := range names {
		n.exact[s] = true
		n.dns[strings.ToLower(s)] = true
	}
	return n
}

// Match reports whether the certificate carries one of the names: its
// subject's common name, one of its DNS names (compared without regard to
// case, as DNS is) or one of its URIs, each compared whole. A wildcard in
// a certificate's DNS name matches only the same wildcard in allow_names.
func (n *Names) Match(c *x509.Certificate) bool {
	if cn := c.Subject.CommonName; cn != "" && n.exact[cn] {
		return true
	}
	for _, d := range c.DNSNames {
		if n.dns[strings.ToLower(d)] {
			return true
		}
	}
	for _, u := range c.URIs {
		if n.exact[u.String()] {
			return true
		}
	}
	return false
}

// CertNames lists the names Match compares: the common name, then the DNS
// names, then the URIs.
func CertNames(c *x509.Certificate) []string {
	var out []string
	if c.Subject.CommonName != "" {
		out = append(out, "CN="+c.Subject.CommonName)
	}
	for _, d := range c.DNSNames {
		out = append(out, "DNS:"+d)
	}
	for _, u := range c.URIs {
		out = append(out, "URI:"+u.String())
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// Revocations is what a listener's certificate revocation lists say.
type Revocations struct {
	// serials holds the revoked serial numbers by the raw subject of the
	// CA that revoked them.
	serials map[string]map[string]bool
}

// NewRevocations indexes lists, whose signatures the caller has checked.
func NewRevocations(lists []*x509.RevocationList) *Revocations {
	r := &Revocations{serials: map[string]map[string]bool{}}
	for _, l := range lists {
		by := r.serials[string(l.RawIssuer)]
		if by == nil {
			by = map[string]bool{}
			r.serials[string(l.RawIssuer)] = by
		}
		for _, e := range l.RevokedCertificateEntries {
			by[e.SerialNumber.String()] = true
		}
	}
	return r
}

// Revoked reports whether a list from c's issuer revokes c.
func (r *Revocations) Revoked(c *x509.Certificate) bool {
	return r.serials[string(c.RawIssuer)][c.SerialNumber.String()]
}
