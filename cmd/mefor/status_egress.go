package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/mefor/mefor/ops"
)

// printEgress says where the live nodes let data go: unrestricted, or the
// allow-list's entries, and warns about outbound plaintext the config does
// not acknowledge and about nodes that disagree.
func printEgress(w io.Writer, es *ops.EgressStatus) {
	if es == nil {
		return
	}
	fmt.Fprintln(w)
	switch len(es.Policies) {
	case 0:
		fmt.Fprintln(w, "egress: no live node has recorded it")
	case 1:
		fmt.Fprintln(w, "egress: "+egressSummary(es.Policies[0].Restricted, es.Policies[0].Allow))
	default:
		var parts []string
		for _, p := range es.Policies {
			parts = append(parts, strings.Join(p.Nodes, ", ")+": "+egressSummary(p.Restricted, p.Allow))
		}
		fmt.Fprintf(w, "warning: egress differs between nodes (%s): give every node the same config file and run mefor reload\n",
			strings.Join(parts, "; "))
	}
	seen := map[ops.PlaintextOutbound][]string{}
	var order []ops.PlaintextOutbound
	for _, p := range es.Policies {
		for _, o := range p.Plaintext {
			if _, ok := seen[o]; !ok {
				order = append(order, o)
			}
			seen[o] = append(seen[o], p.Nodes...)
		}
	}
	for _, o := range order {
		fix := "use https://, or plaintext: true beside its url to acknowledge a trusted network"
		if o.Protocol == "mllp" {
			fix = "add a tls: block, or plaintext: true beside its address to acknowledge a trusted network"
		}
		fmt.Fprintf(w, "warning: %s sends plaintext %s to %s, another machine (nodes %s): %s\n",
			o.Target, strings.ToUpper(o.Protocol), o.Address, strings.Join(seen[o], ", "), fix)
	}
}

// egressSummary reads "unrestricted (...)" or "3 entries (a, b, c)".
func egressSummary(restricted bool, allow []string) string {
	switch {
	case !restricted:
		return "unrestricted (no egress.allow: mefor connects wherever its config points)"
	case len(allow) == 0:
		return "0 entries: no outbound connection is allowed"
	case len(allow) == 1:
		return "1 entry (" + allow[0] + ")"
	}
	return fmt.Sprintf("%d entries (%s)", len(allow), strings.Join(allow, ", "))
}
