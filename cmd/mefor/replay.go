package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/mefor/mefor/internal/apiclient"
	"github.com/mefor/mefor/ops"
)

type replayCmd struct {
	ID   int64 `arg:"" help:"Message id."`
	JSON bool  `name:"json" help:"Print the result as JSON."`
}

func (c *replayCmd) Help() string {
	return `Re-queues one message, with attempts reset and due now:

  - if it has dead or pending rows (any stage), those are re-queued: a dead row
    goes to the back of its lane, a pending row keeps its place (it is still
    queued, and moving it back would let later messages overtake it);
  - otherwise its delivered outbound rows are sent again, each at the back of
    its lane. Stages already handed on (ingress, routed) are never re-run.

Cancelled rows are never touched. The message goes back to received or routed,
its error is cleared, and a 'replayed' event records how many rows. Replaying
a message with nothing to replay (e.g. filtered or unrouted) changes nothing,
says so, and exits 0. An unknown id, or a message whose body retention purged,
exits 1.

Examples:
  mefor replay 42
  mefor replay 42 --json` + apiActionHelp + `
Through the API a message of a channel you do not see is not found.`
}

func (c *replayCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.remote()
	if err != nil {
		return err
	}
	var res ops.ReplayResult
	if cl != nil {
		err = act(ctx, g, cl, fmt.Sprintf("/api/v1/messages/%d/replay", c.ID), nil, &res, c.JSON)
		switch apiclient.StatusOf(err) {
		case http.StatusNotFound:
			err = ops.ErrNotFound
		case http.StatusConflict:
			err = ops.ErrBodyPurged
		}
	} else {
		res, err = query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (ops.ReplayResult, error) {
			return ops.Replay(ctx, pool, c.ID)
		})
	}
	switch {
	case errors.Is(err, ops.ErrNotFound):
		return fmt.Errorf("message %d not found", c.ID)
	case errors.Is(err, ops.ErrBodyPurged):
		return fmt.Errorf("message %d cannot be replayed: its body was purged by retention", c.ID)
	case err != nil:
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	switch res.Mode {
	case ops.ReplayRecover:
		fmt.Fprintf(g.stdout, "message %d: re-queued %d dead or pending row(s); status %s\n", res.MessageID, res.Rows, res.Status)
	case ops.ReplayResend:
		fmt.Fprintf(g.stdout, "message %d: re-sending %d delivered row(s); status %s\n", res.MessageID, res.Rows, res.Status)
	default:
		fmt.Fprintf(g.stdout, "message %d: nothing to replay (no dead or pending rows and no delivered outbound rows); status %s\n",
			res.MessageID, res.Status)
	}
	return nil
}

type replayDeadCmd struct {
	Channel     string `placeholder:"NAME" help:"Only rows of messages of this channel."`
	Destination string `placeholder:"NAME" help:"Only rows for this destination."`
	Yes         bool   `short:"y" help:"Do not ask for confirmation (required when not on a terminal)."`
	JSON        bool   `name:"json" help:"Print the result as JSON (no progress bar)."`
}

func (c *replayDeadCmd) Help() string {
	return `Re-queues every dead-lettered delivery (dead outbound row) matching the
filters, at the back of its lane with attempts reset; each message goes from
error back to routed, with a 'replayed' event per row. Rows dead-lettered while
it runs are not included. Work is done in transactions of 500 rows, with a
progress bar on a terminal; an interrupted run keeps the batches it committed.
Rows whose body retention purged are skipped and counted.

Dead rows of other stages (a handler error, a removed route) are replayed one
message at a time with 'mefor replay ID'.

Without --yes it asks for confirmation on a terminal, and refuses elsewhere.
Through the API it asks before counting, and there is no progress bar: the
API answers once every row is re-queued. It needs a --destination or a
--channel there.

Examples:
  mefor replay-dead --destination lab
  mefor replay-dead --channel adt --destination lab --yes --json` + apiActionHelp
}

func (c *replayDeadCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.remote()
	if err != nil {
		return err
	}
	if cl != nil {
		return c.viaAPI(ctx, g, cl)
	}
	bar := newBar(g, c.JSON, "re-queuing")
	opt := ops.BulkOptions{
		Confirm:  confirmer(g, c.Yes, "re-queue %d dead deliveries"),
		Progress: bar.progress,
	}
	res, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (ops.BulkResult, error) {
		return ops.ReplayDead(ctx, pool, ops.DeadFilter{Channel: c.Channel, Destination: c.Destination}, opt)
	})
	bar.finish()
	if err != nil {
		if res.Rows > 0 {
			return fmt.Errorf("stopped after re-queuing %d of %d rows: %w", res.Rows, res.Matched, err)
		}
		return err
	}
	return c.print(g, res)
}

// viaAPI asks the API to replay: it answers once the rows are re-queued,
// so there is no progress bar, and the confirmation is asked before,
// without the count (the API counts as it replays).
func (c *replayDeadCmd) viaAPI(ctx context.Context, g *Globals, cl *apiclient.Client) error {
	if c.Channel == "" && c.Destination == "" {
		return errors.New("through the API, name a --destination, a --channel or both")
	}
	if !c.Yes {
		ok, err := ask(g, fmt.Sprintf("re-queue the dead deliveries of %s", filterText(c.Channel, c.Destination)))
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintln(g.stdout, "nothing changed")
			return nil
		}
	}
	var res ops.BulkResult
	if err := act(ctx, g, cl, "/api/v1/dead/replay", map[string]string{"channel": c.Channel, "destination": c.Destination}, &res, c.JSON); err != nil {
		return err
	}
	return c.print(g, res)
}

func (c *replayDeadCmd) print(g *Globals, res ops.BulkResult) error {
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	switch {
	case res.Matched == 0:
		fmt.Fprintln(g.stdout, "no dead deliveries match")
	case res.Declined:
		fmt.Fprintln(g.stdout, "nothing changed")
	default:
		fmt.Fprintf(g.stdout, "re-queued %d dead deliveries", res.Rows)
		if res.Skipped > 0 {
			fmt.Fprintf(g.stdout, ", skipped %d whose body was purged", res.Skipped)
		}
		fmt.Fprintln(g.stdout)
	}
	return nil
}

// confirmer asks "what? [y/N]" before a bulk write. With --yes it does not
// ask; off a terminal it refuses, so a script never blocks on a prompt nor
// changes things it did not say --yes to.
func confirmer(g *Globals, yes bool, what string) func(int) (bool, error) {
	if yes {
		return nil
	}
	return func(n int) (bool, error) { return ask(g, fmt.Sprintf(what, n)) }
}

// ask asks "what? [y/N]" on a terminal, and refuses elsewhere.
func ask(g *Globals, what string) (bool, error) {
	if !isTerminal(g.stdout) || !term.IsTerminal(int(os.Stdin.Fd())) {
		return false, &exitError{code: 1, err: errors.New(what + ": pass --yes to confirm (nothing changed)")}
	}
	fmt.Fprint(g.stdout, what+"? [y/N] ")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes", nil
}

// filterText names a channel and destination filter for a question.
func filterText(channel, destination string) string {
	var parts []string
	if channel != "" {
		parts = append(parts, "channel "+channel)
	}
	if destination != "" {
		parts = append(parts, "destination "+destination)
	}
	return strings.Join(parts, " and ")
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// bar is the progress bar of a bulk command: drawn on stderr only when the
// command prints for a human (no --json) and both stdout and stderr are a
// terminal; otherwise every method is a no-op.
type bar struct {
	g    *Globals
	desc string
	pb   *progressbar.ProgressBar
}

func newBar(g *Globals, jsonOut bool, desc string) *bar {
	if jsonOut || !isTerminal(g.stdout) || !isTerminal(g.stderr) {
		return nil
	}
	return &bar{g: g, desc: desc}
}

func (b *bar) progress(done, total int) {
	if b == nil {
		return
	}
	if b.pb == nil {
		b.pb = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(b.g.stderr),
			progressbar.OptionSetDescription(b.desc),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	_ = b.pb.Set(done)
}

func (b *bar) finish() {
	if b == nil || b.pb == nil {
		return
	}
	_ = b.pb.Finish()
}
