package config

import (
	"net"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/admission"
)

// API is the HTTPS operator API every node serves (the api: section; nil
// without it): people log in there with their mefor user (docs/access.md).
type API struct {
	// Listen is host:port.
	Listen string
	// TLS holds cert_file and key_file. Without it the API is plain HTTP,
	// refused on an address other machines reach unless Plaintext.
	TLS ServerTLS
	// Plaintext allows plain HTTP on a reachable address (a trusted
	// network). Defaults to false.
	Plaintext bool
	// Allow lists the sources that may connect, as for an MLLP listener.
	// Defaults to any source.
	Allow []string
	// MaxConnections and MaxConnectionsPerIP cap the connections held.
	// Default to 256 and 16, as an MLLP listener's.
	MaxConnections      int
	MaxConnectionsPerIP int
	// SessionIdle ends a session unused this long. Defaults to 30m.
	SessionIdle time.Duration
	// SessionMax ends a session this long after login. Defaults to 12h.
	SessionMax time.Duration
	// SSO lets people log in through an OpenID Connect provider (sso.go).
	// Defaults to nil: mefor passwords only.
	SSO *SSO
}

// Exposed reports whether the API's address is reachable from other
// machines (not loopback).
func (a *API) Exposed() bool { return (&MLLPInbound{Listen: a.Listen}).Exposed() }

func (l *loader) decodeAPI(n *yaml.Node, p path) *API {
	a := &API{MaxConnections: defaultMaxConnections, MaxConnectionsPerIP: defaultMaxConnectionsPerIP,
		SessionIdle: 30 * time.Minute, SessionMax: 12 * time.Hour}
	m := l.mapping(n, p, "listen", "tls", "plaintext", "allow", "max_connections", "max_connections_per_ip",
		"session_idle", "session_max", "sso")
	decodeScalar(l, m, p, "listen", &a.Listen, asString)
	decodeScalar(l, m, p, "plaintext", &a.Plaintext, parseBool)
	l.strings(m, p, "allow", &a.Allow)
	decodeScalar(l, m, p, "max_connections", &a.MaxConnections, parseInt)
	decodeScalar(l, m, p, "max_connections_per_ip", &a.MaxConnectionsPerIP, parseInt)
	decodeScalar(l, m, p, "session_idle", &a.SessionIdle, parseDuration)
	decodeScalar(l, m, p, "session_max", &a.SessionMax, parseDuration)
	if sn, ok := m["sso"]; ok {
		a.SSO = l.decodeSSO(sn, p.key("sso"))
	}
	if tn, ok := m["tls"]; ok {
		tp := p.key("tls")
		a.TLS = ServerTLS{Enabled: true}
		tm := l.mapping(tn, tp, "cert_file", "key_file")
		decodeScalar(l, tm, tp, "cert_file", &a.TLS.CertFile, asString)
		decodeScalar(l, tm, tp, "key_file", &a.TLS.KeyFile, asString)
	}
	return a
}

// checkAPI checks the api: section: HTTPS unless loopback or plaintext:
// true, as for MLLP listeners; the allow list and caps as a listener's;
// sessions that end.
func (l *loader) checkAPI(c *Config) {
	a := c.API
	if a == nil {
		return
	}
	p := path{section: "api"}
	lp := p.key("listen")
	if a.Listen == "" {
		if !l.failed(lp) {
			l.errorf(lp, "is required: the address the API listens on, e.g. listen: \"0.0.0.0:8443\" (with tls:) or \"127.0.0.1:8080\"")
		}
	} else if !l.failed(lp) {
		if _, _, err := net.SplitHostPort(a.Listen); err != nil {
			l.errorf(lp, "%q is not host:port (e.g. 0.0.0.0:8443)", a.Listen)
		}
	}
	tp := p.key("tls")
	if a.TLS.Enabled {
		if a.Plaintext && !l.failed(p.key("plaintext")) {
			l.errorf(p.key("plaintext"), "is true but a tls: block is set too; remove plaintext: true to serve HTTPS, or the tls: block to serve plain HTTP")
		}
		if a.TLS.CertFile == "" {
			l.errorf(tp.key("cert_file"), "is required: the API's certificate, PEM (e.g. cert_file: /etc/mefor/tls/api.crt)")
		}
		if a.TLS.KeyFile == "" {
			l.errorf(tp.key("key_file"), "is required: the certificate's private key, PEM (e.g. key_file: /etc/mefor/tls/api.key)")
		}
	} else if !a.Plaintext && a.Listen != "" && !l.failed(lp) && a.Exposed() {
		l.errorf(lp, "%s would serve the API in plain HTTP to the network, where anyone on the path can read passwords and session cookies; "+
			"add a tls: block (cert_file, key_file), listen on a loopback address (127.0.0.1), "+
			"or set plaintext: true on a trusted network", a.Listen)
	}
	if ap := p.key("allow"); l.given(ap) && !l.failed(ap) {
		if len(a.Allow) == 0 {
			l.errorf(ap, "is empty, so nobody could connect; list the operators' addresses or networks (e.g. allow: [10.1.0.0/16]), or remove allow to accept any source")
		}
		for _, entry := range a.Allow {
			if _, err := admission.ParseSource(entry); err != nil {
				l.errorf(ap, "%v", err)
			}
		}
	}
	if k := p.key("max_connections"); !l.failed(k) && a.MaxConnections < 1 {
		l.errorf(k, "must be at least 1 (e.g. max_connections: %d, the default)", defaultMaxConnections)
	}
	if k := p.key("max_connections_per_ip"); !l.failed(k) && a.MaxConnectionsPerIP < 1 {
		l.errorf(k, "must be at least 1 (e.g. max_connections_per_ip: %d, the default)", defaultMaxConnectionsPerIP)
	}
	if k := p.key("session_idle"); !l.failed(k) && a.SessionIdle <= 0 {
		l.errorf(k, "must be > 0: how long an unused session lasts (e.g. session_idle: 30m, the default)")
	}
	if k := p.key("session_max"); !l.failed(k) && a.SessionMax < a.SessionIdle {
		l.errorf(k, "must be at least session_idle (%s): how long a session lasts after login (e.g. session_max: 12h, the default)", a.SessionIdle)
	}
}
