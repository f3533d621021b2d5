package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/ops"
)

// printTransport lists the certificates the live nodes use, with their
// expiry, and warns about listeners other machines can reach that serve
// plaintext, or TLS without asking for a client certificate.
// It prints nothing for a cluster without TLS that listens on loopback.
func printTransport(w io.Writer, ts *ops.TransportStatus, now time.Time) error {
	if ts == nil {
		return nil
	}
	if len(ts.Certificates) > 0 {
		fmt.Fprintln(w)
		tw := newTable(w)
		fmt.Fprintln(tw, "CERTIFICATE\tSUBJECT\tEXPIRES\tUSED AS\tNODES")
		for _, c := range ts.Certificates {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.File, c.Subject, expiry(c.NodeCertificate, now),
				strings.Join(c.Uses, "; "), strings.Join(c.Nodes, ", "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, l := range ts.Listeners {
		switch {
		case !l.Flagged:
		case l.TLS:
			fmt.Fprintf(w, "warning: channel %q accepts TLS from any client, without a certificate, on %s, reachable from other machines (nodes %s): "+
				"add inbound.mllp.tls.client_ca_file to require client certificates\n",
				l.Channel, l.Listen, strings.Join(l.Nodes, ", "))
		default:
			fmt.Fprintf(w, "warning: channel %q listens for plaintext MLLP on %s, reachable from other machines (nodes %s): "+
				"add inbound.mllp.tls, or plaintext: true to acknowledge a trusted network\n",
				l.Channel, l.Listen, strings.Join(l.Nodes, ", "))
		}
	}
	return nil
}

// expiry reads as "2026-03-01 (in 89d)", flagged once the nodes warn about
// it and once it has passed.
func expiry(c ops.NodeCertificate, now time.Time) string {
	date := c.NotAfter.UTC().Format(time.DateOnly)
	left := c.NotAfter.Sub(now)
	switch {
	case left <= 0:
		return date + " (EXPIRED)"
	case tlsconf.RenewSoon(c.NotAfter, now, c.NotAfter.Sub(c.WarnFrom)):
		return fmt.Sprintf("%s (in %s, renew soon)", date, fmtDays(left))
	}
	return fmt.Sprintf("%s (in %s)", date, fmtDays(left))
}

func fmtDays(d time.Duration) string {
	if d < 48*time.Hour {
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
