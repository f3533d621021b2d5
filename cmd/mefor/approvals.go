package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"
)

type approvalsCmd struct {
	List    approvalsListCmd    `cmd:"" help:"List requests for approval of the actions you may approve: pending, expired, decided."`
	Approve approvalsApproveCmd `cmd:"" help:"Approve a request: its action runs now, once, and the answer says what it did."`
	Reject  approvalsRejectCmd  `cmd:"" help:"Reject a request: its action never runs."`
}

func (c *approvalsCmd) Help() string {
	return `Dual control: an action the config's access.approvals.required_for names
(replay-dead, cancel, stepdown, ...) is not run when asked for through the API;
it waits as a request until another person who holds its permission approves
or rejects it, within access.approvals.expire (24h by default). The person who
asked can never approve their own request.

These commands go through a node's API, as you: give its URL and your API
token (mefor token create) in MEFOR_API_URL and MEFOR_API_TOKEN, or --api and
--token. They need no database URL. Approving a stepdown needs a session that
re-authenticated within 5 minutes, which an API token cannot do: approve it
from a session (POST /api/v1/reauth, then /approve).

Examples:
  export MEFOR_API_URL=https://mefor-a.example.org:8443 MEFOR_API_TOKEN=mefor_t_...
  mefor approvals list
  mefor approvals approve 12
  mefor approvals reject 13 --json`
}

// approvalView is a request as GET /api/v1/approvals answers it.
type approvalView struct {
	ID          int64           `json:"id"`
	Action      string          `json:"action"`
	Params      json.RawMessage `json:"params"`
	RequestedBy string          `json:"requested_by"`
	RequestedAt time.Time       `json:"requested_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	State       string          `json:"state"`
	DecidedBy   *string         `json:"decided_by,omitempty"`
	DecidedAt   *time.Time      `json:"decided_at,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       *string         `json:"error,omitempty"`
}

type approvalsListCmd struct {
	State string `name:"state" enum:",pending,expired,rejected,running,done,failed" default:"" placeholder:"STATE" help:"Only requests in this state: pending, expired, rejected, running, done or failed."`
	Limit int    `name:"limit" default:"100" help:"At most this many, newest first."`
	JSON  bool   `name:"json" help:"Print JSON."`
}

func (c *approvalsListCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.apiClient()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.Itoa(c.Limit)}}
	if c.State != "" {
		q.Set("state", c.State)
	}
	var out struct {
		Approvals []approvalView `json:"approvals"`
	}
	if _, err := cl.Do(ctx, "GET", "/api/v1/approvals?"+q.Encode(), nil, &out); err != nil {
		return err
	}
	return printList(g.stdout, c.JSON, out.Approvals, listing[approvalView]{
		Empty:  "no requests for approval",
		Header: "ID\tACTION\tON\tREQUESTED BY\tREQUESTED\tSTATE\tDECIDED BY\tEXPIRES",
		Row: func(w io.Writer, a approvalView) {
			by := "-"
			if a.DecidedBy != nil {
				by = *a.DecidedBy
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Action, string(a.Params), a.RequestedBy,
				a.RequestedAt.Local().Format(time.DateTime), a.State, by, a.ExpiresAt.Local().Format(time.DateTime))
		},
	})
}

type approvalsDecideCmd struct {
	ID   int64 `arg:"" help:"The request's id (mefor approvals list)."`
	JSON bool  `name:"json" help:"Print the API's answer as JSON: the request, and the action's result."`
}

type approvalsApproveCmd struct{ approvalsDecideCmd }

func (c *approvalsApproveCmd) Run(ctx context.Context, g *Globals) error {
	return c.decide(ctx, g, "approve")
}

type approvalsRejectCmd struct{ approvalsDecideCmd }

func (c *approvalsRejectCmd) Run(ctx context.Context, g *Globals) error {
	return c.decide(ctx, g, "reject")
}

// decide posts verb (approve or reject) on the request.
func (c *approvalsDecideCmd) decide(ctx context.Context, g *Globals, verb string) error {
	cl, err := g.apiClient()
	if err != nil {
		return err
	}
	var out struct {
		Approval approvalView    `json:"approval"`
		Result   json.RawMessage `json:"result,omitempty"`
	}
	if _, err := cl.Do(ctx, "POST", fmt.Sprintf("/api/v1/approvals/%d/%s", c.ID, verb), nil, &out); err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, out)
	}
	a := out.Approval
	fmt.Fprintf(g.stdout, "approval %d (%s %s, asked by %s): %s\n", a.ID, a.Action, string(a.Params), a.RequestedBy, a.State)
	if len(out.Result) > 0 {
		fmt.Fprintf(g.stdout, "result: %s\n", string(out.Result))
	}
	return nil
}

func (c *approvalsListCmd) Help() string {
	return `Lists the requests of the actions whose permission you hold, newest first:
what was asked (the action and its parameters), by whom, its state (pending,
expired, rejected, running, done, failed) and who decided it.

Examples:
  mefor approvals list
  mefor approvals list --state pending --json`
}

func (c *approvalsApproveCmd) Help() string {
	return `Approves a request someone else made: its action runs now, once, as you, on
the channels both of you see, and the answer says what it did. Your own
requests, expired ones and those already decided are refused.

Examples:
  mefor approvals approve 12
  mefor approvals approve 12 --json`
}

func (c *approvalsRejectCmd) Help() string {
	return `Rejects a request someone else made: its action never runs.

Examples:
  mefor approvals reject 13`
}
