// Package maintenance owns the maintenance run records
// (mefor_maintenance_run): what each run of a maintenance job did.
package maintenance

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// Maintenance run outcomes (mefor_maintenance_run.outcome).
const (
	RunOK     = "ok"
	RunFailed = "failed"
)

// MaintenanceRun is the audit record of one run of a maintenance job.
type MaintenanceRun struct {
	ID int64 `json:"id,omitempty"`
	// Job is the maintenance job's name, e.g. "retention" or
	// "reference-sync:lab-codes".
	Job        string    `json:"job"`
	NodeID     string    `json:"node_id"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// Outcome is RunOK or RunFailed.
	Outcome string `json:"outcome"`
	// Detail holds the run's counts and settings, stored as jsonb. It is
	// shown to operators, so it never holds message content.
	Detail map[string]any `json:"detail,omitempty"`
	// Error says why a failed run failed; no message content.
	Error string `json:"error,omitempty"`
}

// RecordRun appends the audit row of one maintenance run.
func RecordRun(ctx context.Context, db pipeline.DBTX, run MaintenanceRun) error {
	if run.Detail == nil {
		run.Detail = map[string]any{}
	}
	detail, err := json.Marshal(run.Detail)
	if err != nil {
		return fmt.Errorf("record %s run: encode detail: %w", run.Job, err)
	}
	_, err = db.Exec(ctx, `
		INSERT INTO mefor_maintenance_run (job, node_id, started_at, finished_at, outcome, detail, error)
		VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''))`,
		run.Job, run.NodeID, run.StartedAt, run.FinishedAt, run.Outcome, detail, run.Error)
	if err != nil {
		return fmt.Errorf("record %s run: %w", run.Job, err)
	}
	return nil
}

// LastRuns returns the latest run of each named job that has run at least
// once, by job name.
func LastRuns(ctx context.Context, db pipeline.DBTX, names []string) (map[string]MaintenanceRun, error) {
	rows, err := db.Query(ctx, `
		SELECT r.id, r.job, r.node_id, r.started_at, r.finished_at, r.outcome, r.detail, coalesce(r.error, '')
		FROM unnest($1::text[]) AS j(name)
		CROSS JOIN LATERAL (
			SELECT * FROM mefor_maintenance_run WHERE job = j.name ORDER BY id DESC LIMIT 1
		) r`, names)
	if err != nil {
		return nil, fmt.Errorf("read last maintenance runs: %w", err)
	}
	defer rows.Close()
	out := make(map[string]MaintenanceRun)
	for rows.Next() {
		var r MaintenanceRun
		if err := rows.Scan(&r.ID, &r.Job, &r.NodeID, &r.StartedAt, &r.FinishedAt, &r.Outcome, &r.Detail, &r.Error); err != nil {
			return nil, fmt.Errorf("read last maintenance runs: %w", err)
		}
		out[r.Job] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read last maintenance runs: %w", err)
	}
	return out, nil
}

// RunsAfter returns the runs of job recorded after run id after, oldest
// first: `mefor maintenance run --wait` uses it to find the run it asked for.
func RunsAfter(ctx context.Context, db pipeline.DBTX, job string, after int64) ([]MaintenanceRun, error) {
	rows, err := db.Query(ctx, `
		SELECT id, job, node_id, started_at, finished_at, outcome, detail, coalesce(error, '')
		FROM mefor_maintenance_run WHERE job = $1 AND id > $2 ORDER BY id`, job, after)
	if err != nil {
		return nil, fmt.Errorf("read %s runs: %w", job, err)
	}
	defer rows.Close()
	var out []MaintenanceRun
	for rows.Next() {
		var r MaintenanceRun
		if err := rows.Scan(&r.ID, &r.Job, &r.NodeID, &r.StartedAt, &r.FinishedAt, &r.Outcome, &r.Detail, &r.Error); err != nil {
			return nil, fmt.Errorf("read %s runs: %w", job, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s runs: %w", job, err)
	}
	return out, nil
}

// LastRunID is the id of the latest run of job, 0 if it never ran.
func LastRunID(ctx context.Context, db pipeline.DBTX, job string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM mefor_maintenance_run WHERE job = $1`, job).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("read last %s run: %w", job, err)
	}
	return id, nil
}

// LastJobRun describes the latest finished River job of kind with exactly
// these args as a run, for jobs that are not audited (reclaim): River keeps
// finished jobs for a day. ok is false when there is none.
func LastJobRun(ctx context.Context, db pipeline.DBTX, job, kind string, args []byte) (run MaintenanceRun, ok bool, err error) {
	j, ok, err := jobs.LastFinishedJob(ctx, db, kind, args)
	if err != nil {
		return run, false, fmt.Errorf("read last %s job: %w", job, err)
	}
	if !ok {
		return run, false, nil
	}
	run.StartedAt, run.FinishedAt, run.NodeID = j.StartedAt, j.FinishedAt, j.Node
	run.Job, run.Outcome = job, RunOK
	if j.State != "completed" {
		run.Outcome = RunFailed
		run.Error = "River job " + j.State
	}
	return run, true, nil
}
