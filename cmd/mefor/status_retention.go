package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/retention"
)

// printRetention says what retention the live nodes run with, and the
// oldest body still kept.
func printRetention(w io.Writer, rs *retention.Status) {
	if rs == nil {
		return
	}
	switch len(rs.Policies) {
	case 0:
		fmt.Fprintln(w, "retention: no live node has recorded its policy")
	case 1:
		fmt.Fprintf(w, "retention: %s\n", fmtPolicy(rs.Policies[0].Retention))
	default:
		fmt.Fprintln(w, "warning: retention differs between nodes (give every node the same maintenance.retention):")
		for _, p := range rs.Policies {
			fmt.Fprintf(w, "  %s: %s\n", strings.Join(p.Nodes, ", "), fmtPolicy(p.Retention))
		}
	}
	if rs.OldestBodyAt != nil {
		fmt.Fprintf(w, "oldest retained body: %s old (received %s)\n",
			fmtAge(rs.OldestBodyAgeSeconds), rs.OldestBodyAt.UTC().Format(time.RFC3339))
	}
}

// fmtPolicy writes a policy with the config's key names.
func fmtPolicy(r nodeinfo.Retention) string {
	window := func(sec int64, never string) string {
		if sec == 0 {
			return never
		}
		d := time.Duration(sec) * time.Second
		if d%(24*time.Hour) == 0 {
			return fmt.Sprintf("%dd", d/(24*time.Hour))
		}
		return d.String()
	}
	errs := window(r.KeepErrorsSeconds, "forever")
	if r.KeepErrorsDefault {
		errs += " (default)"
	}
	return fmt.Sprintf("keep_bodies %s, keep_dead %s, keep_errors %s, delete_after %s",
		window(r.KeepBodiesSeconds, "forever"), window(r.KeepDeadSeconds, "forever"), errs,
		window(r.DeleteAfterSeconds, "never"))
}
