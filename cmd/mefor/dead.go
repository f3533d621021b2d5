package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/apiclient"
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
  mefor dead list --channel adt --json | jq '.[].message_id'` + apiModeHelp + `
Through the API, --limit is at most 1000.`
}

func (c *deadListCmd) Run(ctx context.Context, g *Globals) error {
	if c.Limit <= 0 {
		return errors.New("--limit must be at least 1")
	}
	rows, err := read(ctx, g, func(cl *apiclient.Client) ([]ops.DeadRow, error) {
		if err := apiLimit(c.Limit); err != nil {
			return nil, err
		}
		q := url.Values{"limit": {strconv.Itoa(c.Limit)}}
		if c.Channel != "" {
			q.Set("channel", c.Channel)
		}
		if c.Destination != "" {
			q.Set("destination", c.Destination)
		}
		return getField[[]ops.DeadRow](ctx, cl, "/api/v1/dead?"+q.Encode(), "dead")
	}, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.DeadRow, error) {
		kr, err := g.keyring()
		if err != nil {
			return nil, err
		}
		return ops.ListDead(ctx, pool, kr, ops.DeadFilter{Channel: c.Channel, Destination: c.Destination, Limit: c.Limit})
	})
	if err != nil {
		return err
	}
	return printList(g.stdout, c.JSON, rows, listing[ops.DeadRow]{
		Empty:  "no dead letters",
		Header: "WORK\tMESSAGE\tCHANNEL\tSTAGE\tDESTINATION\tATTEMPTS\tDEAD AT\tLAST ERROR",
		Row: func(w io.Writer, d ops.DeadRow) {
			dest := d.Destination
			if dest == "" && d.Handler != "" {
				dest = "handler " + d.Handler
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.WorkID, d.MessageID, d.Channel, d.Stage,
				orDash(dest), d.Attempts, fmtTime(d.DeadAt), orDash(oneLine(d.LastError)))
		},
	})
}
