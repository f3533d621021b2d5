package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/ops"
)

type cancelCmd struct {
	Destination string `required:"" placeholder:"NAME" help:"Destination whose pending deliveries to cancel (all its lanes)."`
	Channel     string `placeholder:"NAME" help:"Only deliveries of messages of this channel."`
	Top         bool   `help:"Cancel only the failing head of each lane: the row blocking it."`
	JSON        bool   `name:"json" help:"Print the result as JSON (no progress bar)."`
}

func (c *cancelCmd) Help() string {
	return `Cancels pending deliveries to a destination, across all its lanes: each row
becomes 'cancelled' with a 'cancelled' event, and each message whose rows are
then all finished is finalized (processed, or error if one is dead). Only
deliveries pending when the command starts are cancelled; new arrivals are not
chased. Large sets are cancelled in transactions of 500 rows.

--top cancels only the row blocking each lane: the head of every lane whose
head has already failed at least once. For a destination with several lanes
(parallel or partitioned) that skips the poison message of a stuck lane
without dropping the healthy heads of the other lanes, which are about to be
delivered. A destination whose heads are all healthy has nothing to cancel
with --top. With --channel, a head is cancelled only if it is of that channel.

A delivery being sent at that very moment may still reach the partner; its
outcome is then not recorded over the cancel. Lanes that were waiting out a
backoff behind a cancelled head move on at once.

Examples:
  mefor cancel --destination lab --top
  mefor cancel --destination lab --channel adt
  mefor cancel --destination lab --json`
}

func (c *cancelCmd) Run(ctx context.Context, g *Globals) error {
	if c.Destination == "" {
		return errors.New("--destination must not be empty")
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := ops.NewQueue(pool, g.logger)
	if err != nil {
		return err
	}
	bar := newBar(g, c.JSON, "cancelling")
	f := store.CancelFilter{Destination: c.Destination, Channel: c.Channel, Top: c.Top}
	res, err := ops.Cancel(ctx, pool, q, f, ops.BulkOptions{Progress: bar.progress})
	bar.finish()
	if err != nil {
		if res.Rows > 0 {
			return fmt.Errorf("stopped after cancelling %d of %d rows: %w", res.Rows, res.Matched, err)
		}
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	switch {
	case res.Matched == 0 && c.Top:
		fmt.Fprintf(g.stdout, "no lane of %s is blocked by a failing head; nothing cancelled\n", c.Destination)
	case res.Matched == 0:
		fmt.Fprintf(g.stdout, "no pending deliveries to %s; nothing cancelled\n", c.Destination)
	default:
		fmt.Fprintf(g.stdout, "cancelled %d pending deliveries to %s (%d messages)\n", res.Rows, c.Destination, res.Messages)
	}
	return nil
}
