package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// checkDatabaseTLS refuses a database on another machine reached without
// TLS, or with TLS that may be given up: sslmode disable, allow and prefer.
// prefer, pgx's default when the URL says nothing, tries TLS and silently
// falls back to plaintext, so a misconfigured server (or anyone in the
// path) gets passwords and message content in the clear. A local socket or
// loopback address never leaves the machine and is allowed as it is.
//
// pgx turns sslmode into a TLS configuration per host it will try (several
// for prefer and allow, and for a URL listing several hosts); any attempt
// without TLS to a remote host is refused.
func checkDatabaseTLS(cfg *pgconn.Config, rawURL string) error {
	type attempt struct {
		host  string
		plain bool
	}
	attempts := []attempt{{cfg.Host, cfg.TLSConfig == nil}}
	for _, fb := range cfg.Fallbacks {
		attempts = append(attempts, attempt{fb.Host, fb.TLSConfig == nil})
	}
	for _, a := range attempts {
		if !a.plain || isLocalDatabaseHost(a.host) {
			continue
		}
		return fmt.Errorf("the database URL connects to %s with %s, which may send passwords and patient data "+
			"in plaintext; add sslmode=verify-full&sslrootcert=/path/to/db-ca.crt to the URL "+
			"(e.g. postgres://mefor:PASSWORD@%s:5432/mefor?sslmode=verify-full&sslrootcert=/etc/mefor/tls/db-ca.crt), "+
			"or pass --allow-insecure-database if the network to the database is trusted",
			a.host, describeSSLMode(rawURL), a.host)
	}
	return nil
}

// isLocalDatabaseHost reports whether a host pgx connects to is on this
// machine: a Unix socket directory, localhost, or a loopback address.
func isLocalDatabaseHost(host string) bool {
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
