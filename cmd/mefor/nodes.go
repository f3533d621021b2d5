package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/mefor/mefor/ops"
)

type nodesCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *nodesCmd) Help() string {
	return `Lists every node that joined the cluster: its id, host, pid, when it
started, when it last heartbeat (by the database clock), and its status:
active, stale (missed more than two heartbeats: frozen, cut off or killed;
its running drainers are handed to other nodes once it has been silent for
node_timeout) or left (stopped cleanly).

LEASE marks the node that holds the listener lease and so binds the inbound
listeners; at most one node is marked. RIVER marks River's elected leader,
which schedules the periodic maintenance jobs.

Examples:
  mefor nodes
  mefor nodes --json | jq -r '.[] | select(.holds_lease) | .id'`
}

func (c *nodesCmd) Run(ctx context.Context, g *Globals) error {
	return queryList(ctx, g, c.JSON, ops.ListNodes, listing[ops.Node]{
		Empty:  "no node has joined yet (start one with 'mefor run')",
		Header: "NODE\tHOST\tPID\tSTARTED\tLAST SEEN\tSTATUS\tLEASE\tRIVER",
		Row: func(w io.Writer, n ops.Node) {
			ago := time.Duration(n.LastSeenAgo * float64(time.Second))
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s ago\t%s\t%s\t%s\n", n.ID, n.Host, n.PID,
				n.StartedAt.Local().Format(time.DateTime), ago.Round(100*time.Millisecond), n.Status,
				mark(n.HoldsLease, "holder"), mark(n.RiverLeader, "leader"))
		},
	})
}

func mark(b bool, s string) string {
	if b {
		return s
	}
	return "-"
}
