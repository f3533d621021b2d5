// Package dbtls is the rule every PostgreSQL connection mefor opens obeys:
// a database on another machine is reached only over TLS that cannot be
// given up. The main DATABASE_URL and the databases SQL reference-set
// sources query share it; each caller words the way to lift it.
package dbtls

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// InsecureError is a connection the rule refuses. It names the host and
// the sslmode, never anything else from the URL (a password, say).
type InsecureError struct {
	Host string
	// Mode describes the sslmode asked for, e.g. "sslmode=disable".
	Mode string
}

func (e *InsecureError) Error() string {
	return fmt.Sprintf("connects to %s with %s, which may send passwords and patient data in plaintext", e.Host, e.Mode)
}

// Fix is what to write in the URL instead, e.g. for a refusal's message.
func (e *InsecureError) Fix() string {
	return fmt.Sprintf("add sslmode=verify-full&sslrootcert=/path/to/db-ca.crt to the URL "+
		"(e.g. postgres://USER:PASSWORD@%s:5432/DBNAME?sslmode=verify-full&sslrootcert=/etc/mefor/tls/db-ca.crt)", e.Host)
}

// Check refuses a database on another machine reached without TLS, or with
// TLS that may be given up: sslmode disable, allow and prefer. prefer,
// pgx's default when the URL says nothing, tries TLS and silently falls
// back to plaintext, so a misconfigured server (or anyone in the path) gets
// passwords and message content in the clear. A local socket or loopback
// address never leaves the machine and is allowed as it is.
//
// pgx turns sslmode into a TLS configuration per host it will try (several
// for prefer and allow, and for a URL listing several hosts); any attempt
// without TLS to a remote host is refused with an *InsecureError.
func Check(cfg *pgconn.Config, rawURL string) error {
	type attempt struct {
		host  string
		plain bool
	}
	attempts := []attempt{{cfg.Host, cfg.TLSConfig == nil}}
	for _, fb := range cfg.Fallbacks {
		attempts = append(attempts, attempt{fb.Host, fb.TLSConfig == nil})
	}
	for _, a := range attempts {
		if !a.plain || IsLocalHost(a.host) {
			continue
		}
		return &InsecureError{Host: a.host, Mode: describeSSLMode(rawURL)}
	}
	return nil
}

// IsLocalHost reports whether a host pgx connects to is on this machine: a
// Unix socket directory, localhost, or a loopback address.
func IsLocalHost(host string) bool {
	if strings.HasPrefix(host, "/") || strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// describeSSLMode names the sslmode the URL (or PGSSLMODE) asks for, for
// the refusal message. It never returns anything else from the URL.
func describeSSLMode(rawURL string) string {
	mode := ""
	if u, err := url.Parse(rawURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		mode = u.Query().Get("sslmode")
	} else {
		for _, f := range strings.Fields(rawURL) {
			if v, ok := strings.CutPrefix(f, "sslmode="); ok {
				mode = strings.Trim(v, "'")
			}
		}
	}
	if mode == "" {
		mode = os.Getenv("PGSSLMODE")
	}
	switch mode {
	case "":
		return "no sslmode (pgx then uses prefer, which falls back to plaintext)"
	case "prefer", "allow":
		return "sslmode=" + mode + ", which falls back to plaintext"
	case "disable":
		return "sslmode=disable"
	}
	return "sslmode=" + mode
}
