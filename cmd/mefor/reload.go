package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/ops"
)

// Exit codes of `mefor reload`, distinct so a deploy script can tell a file
// that nothing applied from a cluster that did not (yet) agree.
const (
	exitReloadRejected     = 1 // the file is invalid; nothing changed anywhere
	exitReloadNotConverged = 3 // announced, but some live node did not apply it
)

type reloadCmd struct {
	Config  string        `required:"" type:"existingfile" placeholder:"FILE" help:"The config file the nodes run (validated here, then every node reloads its own copy)."`
	Wait    bool          `default:"true" negatable:"" help:"Wait until every live node applied the file (default); --no-wait only announces it."`
	Timeout time.Duration `default:"30s" help:"How long --wait waits for the nodes."`
	JSON    bool          `name:"json" help:"Print the result as JSON."`
}

func (c *reloadCmd) Help() string {
	return `Validates FILE exactly as 'mefor config check' does and, only if it is valid,
raises the cluster config version. Every node notices within a heartbeat
(at once, through a notification) and reloads its OWN copy of the file: the
graph is swapped without dropping work in flight, changed listeners and
destination connections are reopened, and rows queued for a channel, route,
handler or destination the file removed are dead-lettered (see 'mefor dead
list'; replay them if the removal was a mistake).

A node keeps running its previous config, and records why, when its copy is
invalid or changes what only a restart can: cluster timings, or a longest
connect_timeout + ack_timeout above the one it started with. It retries at
every heartbeat, so fixing its file is enough. A node whose file differs from
FILE (hash) applies its own and is flagged in 'mefor status'.

FILE is validated with this shell's environment for ${VAR} references; each
node validates its copy with its own. SIGHUP to one node does the same as this
command, with that node's file.

Exit codes: 0 every live node applied FILE; 1 FILE is invalid (nothing was
changed); 3 announced, but a node refused it, runs a different file, or did
not answer within --timeout (the table says which and why).

Examples:
  mefor reload --config /etc/mefor/mefor.yaml
  mefor reload --config /etc/mefor/mefor.yaml --timeout 1m --json
  mefor reload --config /etc/mefor/mefor.yaml --no-wait`
}

type reloadResult struct {
	checkedFile
	Hash    string          `json:"hash,omitempty"`
	Version int64           `json:"version,omitempty"`
	Waited  bool            `json:"waited"`
	Wait    *ops.ConfigWait `json:"convergence,omitempty"`
}

func (c *reloadCmd) Run(ctx context.Context, g *Globals) error {
	res := reloadResult{checkedFile: checkedFile{File: c.Config}}
	cfg, err := config.Load(c.Config)
	var errs config.Errors
	switch {
	case errors.As(err, &errs):
		res.Errors = errs
		if err := c.print(g, res); err != nil {
			return err
		}
		return &exitError{code: exitReloadRejected, err: fmt.Errorf("%s: %d problems; not reloaded, the nodes keep their config", c.Config, len(errs))}
	case err != nil:
		return &exitError{code: exitReloadRejected, err: fmt.Errorf("%w; not reloaded", err)}
	}
	res.OK, res.Hash, res.Warnings = true, cfg.Hash(), cfg.Warnings

	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res.Version, err = ops.BumpConfig(ctx, pool, cfg, reloadedBy())
	if err != nil {
		return err
	}
	if c.Wait {
		res.Waited = true
		wctx, cancel := context.WithTimeout(ctx, c.Timeout)
		res.Wait, err = ops.WaitConfig(wctx, pool, res.Version, res.Hash, 200*time.Millisecond)
		cancel()
		if err != nil {
			return err
		}
	}
	if err := c.print(g, res); err != nil {
		return err
	}
	if res.Wait != nil && !res.Wait.Converged {
		return &exitError{code: exitReloadNotConverged, err: fmt.Errorf("config version %d: not every live node applied %s", res.Version, c.Config)}
	}
	return nil
}

func (c *reloadCmd) print(g *Globals, res reloadResult) error {
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	res.printProblems(g.stdout)
	if !res.OK {
		return nil
	}
	fmt.Fprintf(g.stdout, "%s: valid (hash %s); cluster config version %d announced\n", res.File, shortHash(res.Hash), res.Version)
	if res.Wait == nil {
		fmt.Fprintln(g.stdout, "not waiting: see 'mefor status' for each node's applied version")
		return nil
	}
	if len(res.Wait.Nodes) == 0 {
		fmt.Fprintln(g.stdout, "no live node; nodes starting from now on run their file at this version")
		return nil
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "NODE\tSTATE\tAPPLIED\tHASH\tREASON")
	for _, n := range res.Wait.Nodes {
		applied := "-"
		if n.AppliedVersion != nil {
			applied = fmt.Sprint(*n.AppliedVersion)
		}
		// A config error spans lines (one per problem); keep the table one
		// row per node.
		reason := strings.ReplaceAll(n.Reason, "\n", "; ")
		if n.State == ops.ReloadPending {
			reason = "did not answer within --timeout"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Node, n.State, applied, shortHash(n.Hash), reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.Wait.Converged {
		fmt.Fprintf(g.stdout, "converged: %d live node(s) run version %d\n", len(res.Wait.Nodes), res.Version)
	}
	return nil
}

// reloadedBy names the operator and machine, shown in `mefor status`.
func reloadedBy() string {
	host, _ := os.Hostname()
	name := "?"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	return "mefor reload by " + name + "@" + host
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// printConfigStatus prints the config section of `mefor status`: the
// cluster config version and, per live node, what it applied.
func printConfigStatus(w io.Writer, cs *ops.ConfigReport) error {
	if cs == nil {
		return nil
	}
	fmt.Fprintln(w)
	c := cs.Cluster
	if c.Version == 0 {
		fmt.Fprintln(w, "config version 0 (never reloaded)")
	} else {
		fmt.Fprintf(w, "config version %d (hash %s, by %s at %s)\n", c.Version, shortHash(c.Hash), c.BumpedBy,
			c.BumpedAt.Local().Format(time.DateTime))
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tAPPLIED\tHASH\tFLAGS")
	live := 0
	for _, n := range cs.Nodes {
		if !n.Live {
			continue
		}
		live++
		applied := "-"
		if n.Version != nil {
			applied = fmt.Sprint(*n.Version)
		}
		var flags []string
		if n.Behind {
			flags = append(flags, "behind")
		}
		if n.HashMismatch {
			flags = append(flags, "file differs")
		}
		if n.Error != "" {
			flags = append(flags, fmt.Sprintf("reload for version %d failed: %s", deref(n.ErrorVersion),
				strings.ReplaceAll(n.Error, "\n", "; ")))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Node, applied, shortHash(n.Hash), strings.Join(flags, ", "))
	}
	if live == 0 {
		fmt.Fprintln(w, "no live nodes")
		return nil
	}
	return tw.Flush()
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
