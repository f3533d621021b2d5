package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/apiclient"
	"github.com/mefor/mefor/ops"
)

// Exit codes of `mefor stepdown` beyond 0 (released).
const (
	exitStepdownRefused     = 3 // nothing changed: not the holder, no holder, lock busy
	exitStepdownUnconfirmed = 4 // the holder stopped serving but the lease may still be live
	exitStepdownNoAnswer    = 5 // the node did not answer in time
)

type stepdownCmd struct {
	Node    string        `name:"node" placeholder:"ID" help:"Node that should release the lease (default: whichever node holds it)."`
	Wait    bool          `name:"wait" help:"After the release, also wait until another node holds the lease and print it."`
	River   bool          `name:"river" help:"Also ask River's elected leader to resign, so the periodic maintenance jobs move too."`
	Timeout time.Duration `name:"timeout" default:"30s" help:"How long to wait for the node's answer (and, with --wait, for a new holder)."`
	JSON    bool          `name:"json" help:"Print the answer as JSON."`
}

func (c *stepdownCmd) Help() string {
	return `Planned failover: asks the node holding the listener lease to release it and
keep running as a standby. The node stops accepting (messages already received
are stored and acknowledged first), releases the lease, and does not claim it
again for two heartbeats, so another node takes the listeners over within
about one heartbeat. Only the database URL is needed: the request travels as a
row plus a NOTIFY, and the node writes its answer back. Every answer is
recorded in the mefor_stepdown_audit table.

Exit status:
  0  released: the lease is free for another node (with --wait: taken)
  3  refused, nothing changed: the node is not the holder (the answer names
     the holder), no node holds the lease, or the node's lease maintenance
     stayed busy for fence_timeout
  4  release not confirmed: the node stopped serving, but its release write did
     not return, so the lease may still be live and no other node can take it
     until it expires (lease_ttl). Run the command again: the node remembers
     it owes the release and sends it again.
  5  no answer in time: the node may be frozen or cut off from the database;
     check 'mefor nodes'

Examples:
  mefor stepdown --wait
  mefor stepdown --node mefor-a:4711:9f2c1e --json` + apiActionHelp + `
Through the API stepdown needs a re-authentication within the last 5 minutes:
'mefor login', then 'mefor reauth' (an API token cannot). --timeout is at
most 45s there; --river and --wait need the database.`
}

func (c *stepdownCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.remote()
	if err != nil {
		return err
	}
	if cl != nil {
		return c.viaAPI(ctx, g, cl)
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.River {
		q, err := ops.NewQueue(pool, g.logger)
		if err != nil {
			return err
		}
		if err := q.Notify().RequestResign(ctx); err != nil {
			return fmt.Errorf("ask River's leader to resign: %w", err)
		}
	}
	ans, err := ops.RequestStepdown(ctx, pool, ops.StepdownRequest{Node: c.Node, Timeout: c.Timeout, WaitForNew: c.Wait})
	if err != nil {
		return err
	}
	return c.report(g, ans)
}

// viaAPI asks the API for the stepdown, as the person whose session
// re-authenticated ('mefor reauth'); the node waits 15s for the answer.
func (c *stepdownCmd) viaAPI(ctx context.Context, g *Globals, cl *apiclient.Client) error {
	switch {
	case c.River:
		return errNotThroughAPI("--river", "ask River's leader to resign with the database URL ('mefor stepdown --river' without an API)")
	case c.Wait:
		return errNotThroughAPI("--wait", "the API answers with the release; run 'mefor nodes' to see the new holder")
	}
	if c.Timeout > api.MaxActionWait {
		return fmt.Errorf("--timeout %s: through the API at most %s", c.Timeout, api.MaxActionWait)
	}
	body := map[string]string{"timeout": c.Timeout.String()}
	if c.Node != "" {
		body["node"] = c.Node
	}
	var ans ops.StepdownAnswer
	if err := act(ctx, g, cl, "/api/v1/cluster/stepdown", body, &ans, c.JSON); err != nil {
		return err
	}
	return c.report(g, ans)
}

// report prints the node's answer and returns its exit code.
func (c *stepdownCmd) report(g *Globals, ans ops.StepdownAnswer) error {
	if c.JSON {
		if err := writeJSON(g.stdout, ans); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(g.stdout, describeStepdown(ans, c.Wait))
	}
	switch ans.Outcome {
	case ops.OutcomeReleased:
		if c.Wait && ans.NewHolder == "" {
			return &exitError{code: exitStepdownNoAnswer, err: fmt.Errorf("released, but no other node took the lease within %s", c.Timeout)}
		}
		return nil
	case ops.OutcomeReleaseUnconfirmed:
		return &exitError{code: exitStepdownUnconfirmed}
	case ops.OutcomeNoAnswer:
		return &exitError{code: exitStepdownNoAnswer}
	case ops.OutcomeNotHolder, ops.OutcomeLockTimeout, ops.OutcomeNoHolder, ops.OutcomeNotLive:
		return &exitError{code: exitStepdownRefused}
	default:
		return &exitError{code: 1, err: errors.New("unexpected answer " + ans.Outcome)}
	}
}

func describeStepdown(a ops.StepdownAnswer, wait bool) string {
	switch a.Outcome {
	case ops.OutcomeReleased:
		s := fmt.Sprintf("node %s released the listener lease", a.Node)
		if a.ReleasedAt != nil {
			s += " at " + a.ReleasedAt.Local().Format("15:04:05.000")
		}
		switch {
		case a.NewHolder != "":
			s += "; " + a.NewHolder + " holds it now"
		case wait:
			s += "; no other node took it yet"
		}
		return s
	case ops.OutcomeNotHolder:
		holder := a.Holder
		if holder == "" {
			holder = "no node"
		}
		return fmt.Sprintf("refused: node %s does not hold the listener lease (%s holds it); nothing changed", a.Node, holder)
	case ops.OutcomeNoHolder:
		return "refused: no node holds the listener lease; nothing to release"
	case ops.OutcomeNotLive:
		return "refused: " + a.Reason
	case ops.OutcomeLockTimeout:
		return fmt.Sprintf("refused: node %s could not start the release (%s); it still holds the lease. Try again.", a.Node, a.Reason)
	case ops.OutcomeReleaseUnconfirmed:
		return fmt.Sprintf("NOT CONFIRMED: node %s stopped serving the listeners, but its release write did not return (%s). "+
			"The lease may still be live, and then no other node can take it until it expires. "+
			"Run 'mefor stepdown --node %s' again to re-send the release, and check 'mefor nodes'.", a.Node, a.Reason, a.Node)
	case ops.OutcomeNoAnswer:
		return fmt.Sprintf("no answer: %s. The request was withdrawn if the node had not picked it up. "+
			"Check 'mefor nodes': the node may be frozen or cut off from the database.", a.Reason)
	}
	return a.Outcome + ": " + a.Reason
}
