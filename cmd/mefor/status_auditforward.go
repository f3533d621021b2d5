package main

import (
	"fmt"
	"io"
	"time"

	"github.com/mefor/mefor/internal/auditforward"
)

// printAuditForward says, per audit.forward target, whether its receiver
// has the whole audit trail, and warns when it is behind, with why.
func printAuditForward(w io.Writer, targets []auditforward.Status, now time.Time) {
	if len(targets) == 0 {
		return
	}
	fmt.Fprintln(w)
	for _, t := range targets {
		sent := "never"
		if t.SentAt != nil {
			sent = now.Sub(*t.SentAt).Round(time.Second).String() + " ago"
		}
		switch {
		case t.LagRows == 0:
			fmt.Fprintf(w, "audit forward to %s: up to date (row %d, anchor %d; last accepted %s)\n", t.Target, t.Seq, t.AnchorNo, sent)
		case t.LastError != "":
			oldest := t.OldestSeconds
			fmt.Fprintf(w, "warning: audit forward to %s is %d rows behind (oldest %s; last accepted %s): %s\n",
				t.Target, t.LagRows, fmtAge(&oldest), sent, t.LastError)
		default:
			oldest := t.OldestSeconds
			fmt.Fprintf(w, "audit forward to %s: %d rows to send (oldest %s; last accepted %s)\n", t.Target, t.LagRows, fmtAge(&oldest), sent)
		}
	}
}
