package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/ops"
)

type deadCmd struct {
	List deadListCmd `cmd:"" help:"List dead-lettered rows, most recent first."`
}

func (c *deadCmd) Help() string {
	return `Dead letters: rows that gave up (a delivery past its destination's
max_attempts, a handler error, a row whose channel, handler or destination left
the config). They stay until replayed or purged by retention.

Examples:
  mefor dead list
  mefor dead list --destination lab --limit 500
  mefor replay-dead --destination lab --yes`
}

type deadListCmd struct {
	Destination string `placeholder:"NAME" help:"Only rows for this destination."`
	Channel     string `placeholder:"NAME" help:"Only rows of messages of this channel."`
	Limit       int    `default:"50" help:"How many rows to show at most."`
	JSON        bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *deadListCmd) Help() string {
	return `Lists dead rows of every stage, most recently dead first: work row id,
message id, channel, stage, destination (or handler), attempts, last error and
when the row died. Outbound rows (deliveries) are the usual ones; replay them
in bulk with 'mefor replay-dead', or any row with 'mefor replay MESSAGE-ID'.

Examples:
  mefor dead list --destination lab
  mefor dead list --channel adt --json | jq '.[].message_id'`
}

func (c *deadListCmd) Run(ctx context.Context, g *Globals) error {
	if c.Limit <= 0 {
		return errors.New("--limit must be at least 1")
	}
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := ops.ListDead(ctx, pool, kr, pipeline.DeadFilter{Channel: c.Channel, Destination: c.Destination, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		if rows == nil {
			rows = []search.DeadRow{}
		}
		return writeJSON(g.stdout, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(g.stdout, "no dead letters")
		return nil
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "WORK\tMESSAGE\tCHANNEL\tSTAGE\tDESTINATION\tATTEMPTS\tDEAD AT\tLAST ERROR")
	for _, d := range rows {
		dest := d.Destination
		if dest == "" && d.Handler != "" {
			dest = "handler " + d.Handler
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.WorkID, d.MessageID, d.Channel, d.Stage,
			orDash(dest), d.Attempts, fmtTime(d.DeadAt), orDash(oneLine(d.LastError)))
	}
	return tw.Flush()
}
