package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/maintenance"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/workers"
)

// MaintenanceRun is one finished run of a maintenance job.
type MaintenanceRun = maintenance.MaintenanceRun

// Maintenance run outcomes (MaintenanceRun.Outcome).
const (
	RunOK     = maintenance.RunOK
	RunFailed = maintenance.RunFailed
)

// MaintenanceJob is one line of `mefor maintenance list`.
type MaintenanceJob struct {
	Name string `json:"name"`
	// Schedule is as written in the config; empty when the job only runs
	// by hand.
	Schedule string `json:"schedule,omitempty"`
	// NextRun is when the schedule next fires after the last run (or now).
	NextRun *time.Time `json:"next_run,omitempty"`
	// LastRun is the latest finished run, nil if none is known.
	LastRun *maintenance.MaintenanceRun `json:"last_run,omitempty"`
	// Running says a run is in progress now; Queued that one waits for a
	// worker.
	Running bool `json:"running"`
	Queued  bool `json:"queued"`
}

// ListMaintenance lists the maintenance jobs of cfg with their schedule,
// last run and outcome, and next run.
func ListMaintenance(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) ([]MaintenanceJob, error) {
	list := workers.MaintenanceJobs(cfg)
	var names []string
	for _, j := range list {
		if j.Audited {
			names = append(names, j.Name)
		}
	}
	last, err := maintenance.LastRuns(ctx, pool, names)
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return nil, fmt.Errorf("read database clock: %w", err)
	}
	out := make([]MaintenanceJob, 0, len(list))
	for _, j := range list {
		v := MaintenanceJob{Name: j.Name, Schedule: j.Schedule.String()}
		args, err := json.Marshal(j.Args)
		if err != nil {
			return nil, fmt.Errorf("encode %s args: %w", j.Name, err)
		}
		if j.Audited {
			if r, ok := last[j.Name]; ok {
				v.LastRun = &r
			}
		} else {
			r, ok, err := maintenance.LastJobRun(ctx, pool, j.Name, j.Args.Kind(), args)
			if err != nil {
				return nil, err
			}
			if ok {
				v.LastRun = &r
			}
		}
		id, running, err := jobs.LiveJob(ctx, pool, j.Args.Kind(), args)
		if err != nil {
			return nil, err
		}
		v.Running, v.Queued = running, id != 0 && !running
		if !j.Schedule.IsZero() {
			next := nextRun(j.Schedule, v.LastRun, now)
			v.NextRun = &next
		}
		out = append(out, v)
	}
	return out, nil
}

// nextRun estimates when the schedule next fires. A cron schedule fires at
// fixed times; an interval counts from when River's leader started it, which
// the last run's start approximates.
func nextRun(s config.Schedule, last *maintenance.MaintenanceRun, now time.Time) time.Time {
	if _, ok := s.Interval(); ok && last != nil {
		if next := s.Next(last.StartedAt); next.After(now) {
			return next
		}
	}
	return s.Next(now)
}

// MaintenanceQueue is what running a job by hand needs of a River client;
// NewQueue's insert-only client satisfies it.
type MaintenanceQueue interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	JobGet(ctx context.Context, id int64) (*rivertype.JobRow, error)
}

// MaintenanceRunResult is what RunMaintenance did.
type MaintenanceRunResult struct {
	Job   string `json:"job"`
	JobID int64  `json:"job_id"`
	// Joined says a run of the job was already queued or running: that
	// one is what was waited for, as a second run would only repeat it.
	Joined bool `json:"joined"`
	// State is the River job's state when RunMaintenance returned.
	State string `json:"state"`
	// Run is the audit of the run, when waited for and the job is audited.
	Run *maintenance.MaintenanceRun `json:"run,omitempty"`
}

// ErrUnknownJob is returned for a name that is not one of the config's
// maintenance jobs.
var ErrUnknownJob = errors.New("unknown maintenance job")

// RunMaintenance enqueues the maintenance job called name now, for any node
// to work. With wait > 0 it waits up to wait for the run to finish and
// returns its outcome; a run that fails is reported in the result, not as an
// error. Nothing happens unless a node is running to work the job.
func RunMaintenance(ctx context.Context, pool *pgxpool.Pool, q MaintenanceQueue, cfg *config.Config, name string, wait time.Duration) (MaintenanceRunResult, error) {
	res := MaintenanceRunResult{Job: name}
	job, ok := workers.FindMaintenanceJob(cfg, name)
	if !ok {
		var names []string
		for _, j := range workers.MaintenanceJobs(cfg) {
			names = append(names, j.Name)
		}
		return res, fmt.Errorf("%w %q (jobs of this config: %s)", ErrUnknownJob, name, strings.Join(names, ", "))
	}
	before := int64(0)
	if job.Audited {
		var err error
		if before, err = maintenance.LastRunID(ctx, pool, name); err != nil {
			return res, err
		}
	}
	target := map[string]any{"job": name}
	err := audited(ctx, pool, pgx.TxOptions{}, audit.ActionMaintenanceRun, target, func(tx pgx.Tx) (string, error) {
		if err := migrations.RequireRole(ctx, tx, migrations.RoleAdmin, "running a maintenance job"); err != nil {
			return "", err
		}
		ins, err := q.InsertTx(ctx, tx, job.Args, nil)
		if err != nil {
			return "", fmt.Errorf("enqueue %s: %w", name, err)
		}
		res.JobID, res.Joined, res.State = ins.Job.ID, ins.UniqueSkippedAsDuplicate, string(ins.Job.State)
		target["job_id"], target["joined_running"] = res.JobID, res.Joined
		return audit.OutcomeRequested, nil
	})
	if err != nil {
		return res, err
	}
	if wait <= 0 {
		return res, nil
	}

	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	finished := []rivertype.JobState{rivertype.JobStateCompleted, rivertype.JobStateDiscarded, rivertype.JobStateCancelled}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var attemptedAt *time.Time
	for {
		row, err := q.JobGet(ctx, res.JobID)
		if err == nil && row.AttemptedAt != nil {
			attemptedAt = row.AttemptedAt
		}
		switch {
		case errors.Is(err, river.ErrNotFound):
			// Finished jobs are eventually cleaned out by River; one
			// gone this fast finished.
			res.State = string(rivertype.JobStateCompleted)
		case err != nil && ctx.Err() == nil:
			return res, fmt.Errorf("read %s job %d: %w", name, res.JobID, err)
		case err == nil:
			res.State = string(row.State)
		}
		if slices.Contains(finished, rivertype.JobState(res.State)) {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("%s job %d is still %s after %s: is a mefor node running? (it runs on any node; check 'mefor nodes')",
				name, res.JobID, res.State, wait)
		case <-tick.C:
			continue
		}
	}
	if job.Audited {
		runs, err := maintenance.RunsAfter(context.WithoutCancel(ctx), pool, name, before)
		if err != nil {
			return res, err
		}
		if len(runs) == 0 && res.Joined && attemptedAt != nil {
			// The joined run may have written its audit before `before`
			// was read (River marks the job completed a moment after).
			// Its run is then the last one, if it started with that job.
			if runs, err = maintenance.RunsAfter(context.WithoutCancel(ctx), pool, name, before-1); err != nil {
				return res, err
			}
			if len(runs) > 0 && runs[len(runs)-1].StartedAt.Before(attemptedAt.Add(-time.Second)) {
				runs = nil
			}
		}
		if len(runs) > 0 {
			res.Run = &runs[len(runs)-1]
		}
	}
	return res, nil
}
