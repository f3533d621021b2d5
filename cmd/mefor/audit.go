package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/ops"
)

type auditCmd struct {
	List   auditListCmd   `cmd:"" help:"List audited operator actions, newest first."`
	Verify auditVerifyCmd `cmd:"" help:"Recompute the audit log's hash chain; exit 1 naming the first bad row."`
	Anchor auditAnchorCmd `cmd:"" help:"Print the audit log's head (row count and hash) to keep somewhere else."`
}

func (c *auditCmd) Help() string {
	return `The audit log (table mefor_audit) records every operator action: replay,
replay-dead, cancel, stepdown, reload, maintenance run, keys rotate, enqueue,
and every command that shows content: 'messages show --body', 'messages list
--text' and '--patient', 'messages show' and 'dead list' opening sealed error
texts, 'reference show'. Each row says who (OS user, database role, host, and
the node for actions a node took), what, on which target (ids, destination,
counts), and the outcome; never message content. Read commands that show no
content are not recorded.

Rows form a SHA-256 chain, each hashing the one before, so a row altered or
deleted is found by 'audit verify'. No role may write the table: rows are
appended by a function of the database role mefor_audit_writer, and 'audit
verify' fails if someone changes that. The cluster's leader records the
chain's head every 15 minutes (maintenance.audit_anchor), signed with
MEFOR_AUDIT_KEY when the nodes have it; 'audit verify' with the same key
catches a database superuser who rewrote, inserted or deleted rows before
the latest anchor, and catches an anchored row cut off the end with or
without it. You can also keep the output of 'audit anchor' outside the
database and pass it to 'audit verify --anchor'.

Examples:
  mefor audit list --since 24h
  mefor audit list --action view-body --json
  mefor audit anchor >> /secure/mefor-audit-anchors.txt
  mefor audit verify --anchor "$(tail -1 /secure/mefor-audit-anchors.txt)"`
}

type auditListCmd struct {
	Since  string `placeholder:"WHEN" help:"Only actions at or after WHEN: RFC 3339 (2025-03-01T08:00:00Z), a date (2025-03-01) or how long ago (90m, 24h, 7d)."`
	Action string `placeholder:"ACTION" help:"Only this action: replay, replay-dead, cancel, stepdown, reload, maintenance-run, keys-rotate, view-body, search-bodies, search-patient, view-errors, view-reference or enqueue."`
	Limit  int    `default:"100" help:"How many rows to show at most."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *auditListCmd) Help() string {
	return `Lists audited actions newest first: row, time, who (OS user@host, database
role, node), action, outcome and target.

Examples:
  mefor audit list
  mefor audit list --since 2025-03-01T00:00:00Z --action replay-dead
  mefor audit list --since 7d --json | jq '.[] | select(.outcome != "ok")'`
}

var auditActions = ops.AuditedActions()

func (c *auditListCmd) Run(ctx context.Context, g *Globals) error {
	f := ops.AuditFilter{Action: c.Action, Limit: c.Limit}
	if c.Limit <= 0 {
		return errors.New("--limit must be at least 1")
	}
	if c.Action != "" && !slices.Contains(auditActions, c.Action) {
		return fmt.Errorf("--action %q is not an audited action; use one of %s", c.Action, strings.Join(auditActions, ", "))
	}
	if c.Since != "" {
		t, err := parseWhen("since", c.Since, time.Now())
		if err != nil {
			return err
		}
		f.Since = t
	}
	return queryList(ctx, g, c.JSON, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.AuditRecord, error) {
		return ops.ListAudit(ctx, pool, f)
	}, listing[ops.AuditRecord]{
		Empty:  "no audited actions",
		Header: "SEQ\tAT\tWHO\tROLE\tNODE\tACTION\tOUTCOME\tTARGET",
		Row: func(w io.Writer, r ops.AuditRecord) {
			who := oneLine(r.OSUser) + "@" + oneLine(r.Host)
			if r.Actor != "" {
				// A mefor user acted (through the API): name the person.
				who = oneLine(r.Actor) + " (" + who + ")"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, fmtTime(r.At), who,
				r.DBRole, orDash(r.Node), r.Action, r.Outcome, oneLine(string(r.Target)))
		},
	})
}

type auditVerifyCmd struct {
	Anchor string `placeholder:"SEQ:HASH" help:"An anchor printed earlier by 'mefor audit anchor': also check that its row is still there, unchanged (catches rows cut off the end)."`
	JSON   bool   `name:"json" help:"Print the result as JSON."`
}

func (c *auditVerifyCmd) Help() string {
	return `Recomputes every row's hash from the first row to the last. Exits 0 when the
chain holds; exits 1 naming the first row that was altered, or that follows
deleted rows. With --anchor it also checks the anchored row: rows deleted from
the end, or a log rebuilt from scratch, fail there.

Examples:
  mefor audit verify
  mefor audit verify --anchor 1842:9b1f0c...e4 --json`
}

func (c *auditVerifyCmd) Run(ctx context.Context, g *Globals) error {
	var anchor *ops.AuditAnchor
	if c.Anchor != "" {
		a, err := ops.ParseAuditAnchor(c.Anchor)
		if err != nil {
			return fmt.Errorf("--anchor: %w", err)
		}
		anchor = &a
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := ops.AuditKeysFromEnv(g.env())
	if err != nil {
		return err
	}
	v, err := ops.VerifyAudit(ctx, pool, anchor, keys)
	if err != nil {
		return err
	}
	if c.JSON {
		if err := writeJSON(g.stdout, v); err != nil {
			return err
		}
		if !v.OK() {
			return &exitError{code: 1}
		}
		return nil
	}
	if len(v.Setup) > 0 {
		return &exitError{code: 1, err: fmt.Errorf("the audit log is not protected: %s; run 'mefor migrate' as a superuser to restore it",
			strings.Join(v.Setup, "; "))}
	}
	if !v.OK() {
		return &exitError{code: 1, err: fmt.Errorf("audit log does not verify at row %d: %s", v.BadSeq, v.Problem)}
	}
	fmt.Fprintf(g.stdout, "audit log verified: %d rows, head %s\n", v.Rows, v.Head)
	switch {
	case v.LatestAnchor == nil:
		fmt.Fprintln(g.stdout, "no stored anchors yet (the leader takes one every maintenance.audit_anchor)")
	case !v.Keyed:
		fmt.Fprintf(g.stdout, "%d stored anchors hold, the latest at row %d (%s); signatures not checked: set MEFOR_AUDIT_KEY\n",
			v.Anchors, v.LatestAnchor.Seq, fmtTime(v.LatestAnchor.TakenAt))
	default:
		fmt.Fprintf(g.stdout, "%d stored anchors hold, %d signed under MEFOR_AUDIT_KEY, the latest at row %d (%s)\n",
			v.Anchors, v.AnchorsSigned, v.LatestAnchor.Seq, fmtTime(v.LatestAnchor.TakenAt))
	}
	if v.SetupNote != "" {
		fmt.Fprintln(g.stdout, "warning: "+v.SetupNote)
	}
	if anchor != nil {
		fmt.Fprintf(g.stdout, "anchor %d:%s is in the log\n", anchor.Seq, shortHash(anchor.Hash))
	}
	return nil
}

type auditAnchorCmd struct {
	JSON bool `name:"json" help:"Print the anchor as JSON."`
}

func (c *auditAnchorCmd) Help() string {
	return `Prints the audit log's head as SEQ:HASH (the last row's number and hash). Keep
it outside the database; 'mefor audit verify --anchor SEQ:HASH' later proves
that no row up to it was deleted or changed.

Examples:
  mefor audit anchor
  mefor audit anchor | logger -t mefor-audit-anchor`
}

func (c *auditAnchorCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := ops.AuditHead(ctx, pool)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, a)
	}
	fmt.Fprintln(g.stdout, a)
	return nil
}
