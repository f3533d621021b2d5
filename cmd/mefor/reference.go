package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/ops"
	"github.com/riverqueue/river"
)

type referenceCmd struct {
	List referenceListCmd `cmd:"" help:"List the reference sets: live version, rows, last sync, last failure."`
	Show referenceShowCmd `cmd:"" help:"Show a reference set and rows of its live snapshot."`
	Sync referenceSyncCmd `cmd:"" help:"Sync a reference set from its source now, on whichever node picks it up."`
}

func (c *referenceCmd) Help() string {
	return `Reference sets are code-mapping tables (e.g. local lab codes to LOINC) that
map handlers translate fields through with a lookup edit. Each is synced from
its source (CSV file, SQL query, HTTP URL) on its refresh schedule into a
database snapshot; every node serves lookups from its in-memory copy and picks
up a new snapshot within one heartbeat. A failed sync keeps the last snapshot.

Examples:
  mefor reference list --config mefor.yaml
  mefor reference show lab-codes --config mefor.yaml --key GLU
  mefor reference sync lab-codes --config mefor.yaml --wait 1m`
}

type referenceListCmd struct {
	Config string `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *referenceListCmd) Help() string {
	return `Lists each reference set of the config: the live snapshot's version, rows
and value columns, when it was synced, and the last failed sync if it failed
since. Version 0 means the set has no snapshot yet; lookups in it wait (their
messages stay queued) until a sync succeeds.

Examples:
  mefor reference list --config mefor.yaml
  mefor reference list --config mefor.yaml --json | jq '.[] | select(.last_error != null)'`
}

func (c *referenceListCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		return err
	}
	return queryList(ctx, g, c.JSON, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.ReferenceSetView, error) {
		return ops.ListReferenceSets(ctx, pool, cfg)
	}, listing[ops.ReferenceSetView]{
		Empty:  "the config declares no reference sets",
		Header: "SET\tVERSION\tROWS\tCOLUMNS\tSYNCED\tREFRESH\tSOURCE\tLAST ERROR",
		Row: func(w io.Writer, s ops.ReferenceSetView) {
			version, synced := "none", "never"
			if s.Version > 0 {
				version = fmt.Sprint(s.Version)
			}
			if s.SyncedAt != nil {
				synced = fmtTime(*s.SyncedAt)
			}
			lastErr := "-"
			if s.LastError != "" && s.LastErrorAt != nil {
				lastErr = fmtTime(*s.LastErrorAt) + " " + oneLine(s.LastError)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, version, s.Rows, orDash(strings.Join(s.Columns, ",")),
				synced, s.Refresh, s.Configured, lastErr)
		},
	})
}

type referenceShowCmd struct {
	Name   string `arg:"" help:"The reference set."`
	Config string `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run."`
	Key    string `placeholder:"KEY" help:"Only the row of this key."`
	Limit  int    `default:"50" help:"How many rows to show at most."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *referenceShowCmd) Help() string {
	return `Shows a reference set's live snapshot: version, source, last sync and last
failure, then its rows in key order (the first --limit, or the one --key).
These are the values every node's lookups return.

Examples:
  mefor reference show lab-codes --config mefor.yaml
  mefor reference show lab-codes --config mefor.yaml --key GLU
  mefor reference show lab-codes --config mefor.yaml --limit 0 --json > lab-codes.json`
}

func (c *referenceShowCmd) Run(ctx context.Context, g *Globals) error {
	if c.Limit < 0 {
		return errors.New("--limit must be 0 (all rows) or more")
	}
	cfg, pool, err := g.configAndPool(ctx, c.Config)
	if err != nil {
		return err
	}
	defer pool.Close()
	kr, err := g.configKeyring(cfg)
	if err != nil {
		return err
	}
	d, err := ops.ShowReferenceSet(ctx, pool, kr, cfg, c.Name, c.Key, c.Limit)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, d)
	}
	w := g.stdout
	fmt.Fprintf(w, "set:      %s\n", d.Name)
	fmt.Fprintf(w, "source:   %s\n", d.Configured)
	fmt.Fprintf(w, "refresh:  %s\n", d.Refresh)
	if d.Version == 0 {
		fmt.Fprintln(w, "snapshot: none yet (lookups wait until a sync succeeds)")
	} else {
		fmt.Fprintf(w, "snapshot: version %d, %d rows, synced %s from %s\n", d.Version, d.ReferenceSetInfo.Rows, fmtTime(*d.SyncedAt), d.Source)
	}
	if d.LastError != "" && d.LastErrorAt != nil {
		fmt.Fprintf(w, "failed:   %s %s\n", fmtTime(*d.LastErrorAt), oneLine(d.LastError))
	}
	if d.Version == 0 {
		return nil
	}
	fmt.Fprintln(w)
	if len(d.Rows) == 0 {
		if c.Key != "" {
			fmt.Fprintln(w, "no row with that key")
			return &exitError{code: 1, err: errors.New("key not in the set")}
		}
		fmt.Fprintln(w, "the snapshot has no rows")
		return nil
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\t"+strings.ToUpper(strings.Join(d.Columns, "\t")))
	for _, r := range d.Rows {
		fmt.Fprintln(tw, r.Key+"\t"+strings.Join(r.Values, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d.More {
		fmt.Fprintf(w, "(first %d rows; --limit 0 shows all)\n", c.Limit)
	}
	return nil
}

type referenceSyncCmd struct {
	Name   string        `arg:"" help:"The reference set."`
	Config string        `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run."`
	Wait   time.Duration `default:"1m" placeholder:"DURATION" help:"Wait up to this long for the sync to finish (0: just enqueue)."`
	JSON   bool          `name:"json" help:"Print JSON."`
}

func (c *referenceSyncCmd) Help() string {
	return `Enqueues a sync of the reference set now, instead of waiting for its refresh
schedule; a running node works it (any node), reading the source from that
node. If a sync of the set is already queued or running, that one is waited
for. It prints the outcome: the new version and row count, or why it failed
(the last snapshot then stays live). Exit status 1 when the sync failed or did
not finish within --wait.

Examples:
  mefor reference sync lab-codes --config mefor.yaml
  mefor reference sync lab-codes --config mefor.yaml --wait 0
  mefor reference sync lab-codes --config mefor.yaml --json`
}

func (c *referenceSyncCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		return err
	}
	res, err := queued(ctx, g, func(ctx context.Context, pool *pgxpool.Pool, q *river.Client[pgx.Tx]) (ops.MaintenanceRunResult, error) {
		return ops.SyncReferenceSet(ctx, pool, q, cfg, c.Name, c.Wait)
	})
	if err != nil {
		return err
	}
	failed := c.Wait > 0 && (res.Run == nil && res.State != "completed" || res.Run != nil && res.Run.Outcome == ops.RunFailed)
	if c.JSON {
		if err := writeJSON(g.stdout, res); err != nil {
			return err
		}
	} else {
		switch {
		case res.Run != nil && res.Run.Outcome == ops.RunOK:
			fmt.Fprintf(g.stdout, "%s: synced on %s: version %v, %v rows\n", c.Name, res.Run.NodeID, res.Run.Detail["version"], res.Run.Detail["rows"])
		case res.Run != nil:
			fmt.Fprintf(g.stdout, "%s: sync failed on %s, the last snapshot stays live: %s\n", c.Name, res.Run.NodeID, oneLine(res.Run.Error))
		case c.Wait > 0:
			fmt.Fprintf(g.stdout, "%s: sync job %d is %s\n", c.Name, res.JobID, res.State)
		case res.Joined:
			fmt.Fprintf(g.stdout, "%s: a sync is already queued or running (job %d)\n", c.Name, res.JobID)
		default:
			fmt.Fprintf(g.stdout, "%s: sync enqueued (job %d)\n", c.Name, res.JobID)
		}
	}
	if failed {
		return &exitError{code: 1, err: errors.New("sync of " + c.Name + " failed")}
	}
	return nil
}
