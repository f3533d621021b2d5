package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/ops"
	"github.com/riverqueue/river"
)

type maintenanceCmd struct {
	List maintenanceListCmd `cmd:"" help:"List the maintenance jobs: schedule, last run and outcome, next run."`
	Run  maintenanceRunCmd  `cmd:"" help:"Run one maintenance job now, on whichever node picks it up."`
}

func (c *maintenanceCmd) Help() string {
	return `Maintenance jobs run on the schedules of the config's maintenance: section
(and reference_sets' refresh:). River's elected leader enqueues each run and
any node works it; every run of retention and of a reference sync is audited
with its counts.

  reclaim               re-activates lanes left with backlog and no drainer
  retention             purges message content past maintenance.retention's windows
  reference-sync:NAME   reloads reference set NAME from its source

Examples:
  mefor maintenance list --config mefor.yaml
  mefor maintenance run retention --config mefor.yaml --wait 30m`
}

type maintenanceListCmd struct {
	Config string `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run (schedules come from it)."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *maintenanceListCmd) Help() string {
	return `Lists each maintenance job of the config with its schedule, when it last
finished, its outcome (ok or failed; "running" or "queued" when a run is under
way), what it did (counts) and when it runs next. Reclaim's last run comes from
River's job table, which keeps a day of finished jobs.

Examples:
  mefor maintenance list --config mefor.yaml
  mefor maintenance list --config mefor.yaml --json | jq '.[] | select(.last_run.outcome == "failed")'`
}

func (c *maintenanceListCmd) Run(ctx context.Context, g *Globals) error {
	cfg, pool, err := g.configAndPool(ctx, c.Config)
	if err != nil {
		return err
	}
	defer pool.Close()
	list, err := ops.ListMaintenance(ctx, pool, cfg)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, list)
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "JOB\tSCHEDULE\tLAST RUN\tOUTCOME\tDETAIL\tNEXT RUN")
	for _, j := range list {
		last, outcome, detail := "never", "-", "-"
		if r := j.LastRun; r != nil {
			last, outcome, detail = fmtTime(r.FinishedAt), r.Outcome, runDetail(r)
		}
		switch {
		case j.Running:
			outcome = "running"
		case j.Queued:
			outcome = "queued"
		}
		next := "by hand only"
		if j.NextRun != nil {
			next = fmtTime(*j.NextRun)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", j.Name, orDash(j.Schedule), last, outcome, detail, next)
	}
	return tw.Flush()
}

// runDetail is a run's counts as key=value, or its error when it failed.
func runDetail(r *ops.MaintenanceRun) string {
	if r.Outcome == ops.RunFailed && r.Error != "" {
		return oneLine(r.Error)
	}
	keys := make([]string, 0, len(r.Detail))
	for k, v := range r.Detail {
		if _, isNumber := v.(float64); isNumber {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, r.Detail[k])
	}
	return orDash(strings.Join(parts, " "))
}

type maintenanceRunCmd struct {
	Name   string        `arg:"" help:"The job: reclaim, retention or reference-sync:NAME (see 'mefor maintenance list')."`
	Config string        `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run."`
	Wait   time.Duration `placeholder:"DURATION" help:"Wait up to this long for the run to finish and print its outcome (e.g. --wait 30m)."`
	JSON   bool          `name:"json" help:"Print JSON."`
}

func (c *maintenanceRunCmd) Help() string {
	return `Enqueues one run of a maintenance job now, for example retention before a
disk fills, instead of waiting for its schedule. A running mefor node works it
(any node, not only the leader). If a run of the job is already queued or
running, that run is the one waited for. With --wait the command waits for the
run to finish and prints its outcome and counts; it exits non-zero when the
run failed or did not finish in time.

Examples:
  mefor maintenance run retention --config mefor.yaml --wait 30m
  mefor maintenance run reference-sync:lab-codes --config mefor.yaml
  mefor maintenance run reclaim --config mefor.yaml --wait 1m --json`
}

func (c *maintenanceRunCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		return err
	}
	res, err := queued(ctx, g, func(ctx context.Context, pool *pgxpool.Pool, q *river.Client[pgx.Tx]) (ops.MaintenanceRunResult, error) {
		return ops.RunMaintenance(ctx, pool, q, cfg, c.Name, c.Wait)
	})
	if err != nil {
		return err
	}
	failed := res.Run != nil && res.Run.Outcome == ops.RunFailed || res.Run == nil && res.State != "" &&
		c.Wait > 0 && res.State != "completed"
	if c.JSON {
		if err := writeJSON(g.stdout, res); err != nil {
			return err
		}
	} else {
		how := "enqueued"
		if res.Joined {
			how = "already queued or running; joined"
		}
		fmt.Fprintf(g.stdout, "%s: %s (job %d)\n", res.Job, how, res.JobID)
		switch {
		case res.Run != nil:
			fmt.Fprintf(g.stdout, "%s: %s in %s on %s: %s\n", res.Job, res.Run.Outcome,
				res.Run.FinishedAt.Sub(res.Run.StartedAt).Round(time.Millisecond), res.Run.NodeID, runDetail(res.Run))
		case c.Wait > 0:
			fmt.Fprintf(g.stdout, "%s: %s\n", res.Job, res.State)
		}
	}
	if failed {
		return &exitError{code: 1, err: errors.New(res.Job + " failed")}
	}
	return nil
}
