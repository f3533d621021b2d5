package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/ops"
)

type statusCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of tables."`

	keys *crypt.Keyring // this command's MEFOR_ENCRYPTION_KEYS
	// viaAPI is set when the status came through the API: the node opens
	// content, so this command's own keys do not matter.
	viaAPI bool
}

func (c *statusCmd) Help() string {
	return `Shows, per channel: messages received (MESSAGES; "received" in JSON), how
many are now in each status (RECEIVED .. ERROR; "by_status"), how many
are queued for routing or transformation, and how long the oldest of those has
waited. Per destination: lanes, deliveries queued, in flight (lanes whose
drainer is running with a due head: being sent now), delivered, dead and
cancelled, and the age of the oldest queued delivery. Ages are by the database
clock, from when the row was created. The first line names the node holding
the listener lease (and when it expires unless renewed), River's elected
leader and how many nodes are active ('mefor nodes' lists them). Per node: the cluster config version it
applied and its file's hash, flagged "behind" when it has not applied the
latest 'mefor reload' (with the reason it recorded) and "file differs" when
its file is not the one that reload validated. Under the channels: the
retention policy the live nodes run with (keep_bodies, keep_dead, keep_errors,
delete_after; keep_errors applies even without a retention block) and the age
of the oldest message body retention has not purged yet ("retention" in JSON).

Last, the certificates the live nodes loaded from their own files ("transport"
in JSON): file, subject, expiry, what each serves as and which nodes use it,
marked "renew soon" inside tls_expiry_warning and "EXPIRED" past it; and a
warning for each channel listening on an address other machines can reach
in plaintext (allowed there by plaintext: true, or by an older config), or
over TLS without asking for a client certificate. Each node records these
when it starts and at each reload, so the list is what is in use, not what a
config file on this machine says ('mefor config check' reads the files).

Then whether content is encrypted at rest, and where data may go ("egress"):
"unrestricted" when the config has no egress: section, else the entries of
egress.allow, with a warning for each destination, reference source or
webhook reached in plaintext on another machine unless its config says
plaintext: true, and when the live nodes run different lists.

Examples:
  mefor status
  mefor status --json | jq '.destinations[] | select(.dead > 0)'` + apiModeHelp
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.remote()
	if err != nil {
		return err
	}
	var st *ops.StatusReport
	if cl != nil {
		c.viaAPI = true
		if _, err := cl.Do(ctx, "GET", "/api/v1/status", nil, &st); err != nil {
			return err
		}
	} else {
		if c.keys, err = g.keyring(); err != nil {
			return err
		}
		if st, err = query(ctx, g, ops.Status); err != nil {
			return err
		}
	}
	if c.JSON {
		return writeJSON(g.stdout, st)
	}
	printClusterLine(g.stdout, st.Cluster)

	if len(st.Channels) == 0 {
		fmt.Fprintln(g.stdout, "no messages yet")
	} else {
		tw := newTable(g.stdout)
		fmt.Fprintln(tw, "CHANNEL\tMESSAGES\tQUEUED\tOLDEST QUEUED\tRECEIVED\tROUTED\tUNROUTED\tFILTERED\tPROCESSED\tERROR")
		for _, ch := range st.Channels {
			s := ch.ByStatus
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", ch.Channel, ch.Received, ch.Queued,
				fmtAge(ch.OldestQueuedSeconds), s[ops.StatusReceived], s[ops.StatusRouted], s[ops.StatusUnrouted],
				s[ops.StatusFiltered], s[ops.StatusProcessed], s[ops.StatusError])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	printRetention(g.stdout, st.Retention)

	fmt.Fprintln(g.stdout)
	if len(st.Destinations) == 0 {
		fmt.Fprintln(g.stdout, "no deliveries yet")
		return c.printTail(g.stdout, st)
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "DESTINATION\tLANES\tQUEUED\tIN FLIGHT\tOLDEST QUEUED\tDELIVERED\tDEAD\tCANCELLED")
	for _, d := range st.Destinations {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\n", d.Destination, d.Lanes, d.Queued, d.InFlight,
			fmtAge(d.OldestQueuedSeconds), d.Delivered, d.Dead, d.Cancelled)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return c.printTail(g.stdout, st)
}

// printTail prints what follows the counts: each node's config, then the
// certificates in use and the plaintext listeners.
func (c *statusCmd) printTail(w io.Writer, st *ops.StatusReport) error {
	if err := printConfigStatus(w, st.Config); err != nil {
		return err
	}
	if err := printTransport(w, st.Transport, st.At); err != nil {
		return err
	}
	printEncryption(w, st.Encryption, c.keys, c.viaAPI)
	printEgress(w, st.Egress)
	printAuditForward(w, st.AuditForward, st.At)
	return nil
}

// fmtAge prints an age in seconds the way an operator reads it: "-" for
// none, then 45s, 12m3s, 5h2m, 3d4h.
func fmtAge(sec *float64) string {
	if sec == nil {
		return "-"
	}
	d := time.Duration(math.Round(*sec)) * time.Second
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// printClusterLine summarizes who serves the listeners and who schedules
// maintenance, above the counts.
func printClusterLine(w io.Writer, cl *ops.ClusterStatus) {
	if cl == nil {
		return
	}
	holder := "none (no node holds it)"
	if cl.ActiveNodes > 0 && cl.ListenerCandidates == 0 {
		holder = "none: every active node has listener_priority 0, so none may take the listeners"
	}
	if cl.LeaseHolder != "" {
		holder = cl.LeaseHolder
		if cl.LeaseExpiresAt != nil {
			holder += " (expires " + cl.LeaseExpiresAt.Local().Format("15:04:05.000") + ")"
		}
	}
	river := cl.RiverLeader
	if river == "" {
		river = "none elected"
	}
	fmt.Fprintf(w, "cluster: %d nodes (%d active); listener lease: %s; River leader: %s\n\n", cl.Nodes, cl.ActiveNodes, holder, river)
}
