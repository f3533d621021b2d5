package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/ops"
)

type cancelCmd struct {
	Destination string        `required:"" placeholder:"NAME" help:"Destination whose pending deliveries to cancel (all its lanes)."`
	Channel     string        `placeholder:"NAME" help:"Only deliveries of messages of this channel."`
	Top         bool          `help:"Cancel only the failing head of each lane: the row blocking it."`
	Wait        time.Duration `default:"30s" placeholder:"DURATION" help:"How long to wait for deliveries that may be being sent right now to end delivered or cancelled (0: do not wait)."`
	JSON        bool          `name:"json" help:"Print the result as JSON (no progress bar)."`
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

A delivery never ends cancelled once it may have reached the partner. When a
lane's drainer is running, it may be sending one of that lane's rows right
now, so cancel marks the lane's rows and the drainer settles them: rows it
has not sent are cancelled, the row it was sending ends delivered (the
partner's reply is kept) or failed, as the partner answered. cancel waits
--wait for that and says how each row ended. A row still undecided when the
wait ends is listed; it will be cancelled unless its drainer had already sent
it ('mefor messages show ID' tells). Lanes that were waiting out a backoff
behind a cancelled head move on at once.

Exit status: 0 when every matching row ended cancelled or as the partner
answered; 3 when some were still being sent when --wait ran out.

Examples:
  mefor cancel --destination lab --top
  mefor cancel --destination lab --channel adt
  mefor cancel --destination lab --wait 2m
  mefor cancel --destination lab --json` + apiActionHelp + `
Through the API --wait is at most 45s, and a person with a channel scope
cancels only their channels' deliveries.`
}

func (c *cancelCmd) Run(ctx context.Context, g *Globals) error {
	if c.Destination == "" {
		return errors.New("--destination must not be empty")
	}
	cl, err := g.remote()
	if err != nil {
		return err
	}
	var res ops.BulkResult
	if cl != nil {
		if c.Wait > api.MaxActionWait {
			return fmt.Errorf("--wait %s: through the API at most %s", c.Wait, api.MaxActionWait)
		}
		err = act(ctx, g, cl, "/api/v1/destinations/"+url.PathEscape(c.Destination)+"/cancel",
			map[string]any{"top": c.Top, "channel": c.Channel, "wait": c.Wait.String()}, &res, c.JSON)
		if err != nil {
			return err
		}
	} else {
		bar := newBar(g, c.JSON, "cancelling")
		f := ops.CancelFilter{Destination: c.Destination, Channel: c.Channel, Top: c.Top}
		res, err = query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (ops.BulkResult, error) {
			return ops.Cancel(ctx, pool, f, ops.BulkOptions{Progress: bar.progress, Wait: c.Wait})
		})
		bar.finish()
	}
	if err != nil {
		if res.Rows > 0 {
			return fmt.Errorf("stopped after cancelling %d of %d rows: %w", res.Rows, res.Matched, err)
		}
		return err
	}
	if c.JSON {
		if err := writeJSON(g.stdout, res); err != nil {
			return err
		}
	} else {
		printCancel(g, c, res)
	}
	if res.InFlight > 0 {
		return &exitError{code: 3, err: errors.New("some deliveries were still being sent when --wait ran out")}
	}
	return nil
}

func printCancel(g *Globals, c *cancelCmd, res ops.BulkResult) {
	w := g.stdout
	switch {
	case res.Matched == 0 && c.Top:
		fmt.Fprintf(w, "no lane of %s is blocked by a failing head; nothing cancelled\n", c.Destination)
		return
	case res.Matched == 0:
		fmt.Fprintf(w, "no pending deliveries to %s; nothing cancelled\n", c.Destination)
		return
	}
	fmt.Fprintf(w, "cancelled %d pending deliveries to %s (%d messages)\n", res.Rows, c.Destination, res.Messages)
	if res.Delivered > 0 {
		v := verb(res.Delivered)
		fmt.Fprintf(w, "%d %s being sent and %s delivered (the partner's reply is kept): %s\n",
			res.Delivered, v, v, messageList(res.DeliveredMessages))
	}
	if res.Dead > 0 {
		v := verb(res.Dead)
		fmt.Fprintf(w, "%d %s being sent, failed and %s dead-lettered: %s\n", res.Dead, v, v, messageList(res.DeadMessages))
	}
	if res.InFlight > 0 {
		fmt.Fprintf(w, "%d still being sent after %s: each ends cancelled, or delivered if the partner accepts it; "+
			"see 'mefor messages show ID' or run cancel again with a longer --wait: %s\n",
			res.InFlight, c.Wait, messageList(res.InFlightMessages))
	}
}

// verb is "was" for one, "were" for more.
func verb(n int) string {
	if n == 1 {
		return "was"
	}
	return "were"
}

// messageList names messages for a one-line report.
func messageList(ids []int64) string {
	const most = 10
	parts := make([]string, 0, min(len(ids), most)+1)
	for i, id := range ids {
		if i == most {
			parts = append(parts, fmt.Sprintf("and %d more", len(ids)-most))
			break
		}
		parts = append(parts, "message "+strconv.FormatInt(id, 10))
	}
	return strings.Join(parts, ", ")
}
