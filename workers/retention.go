package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/maintenance"
	"github.com/mefor/mefor/internal/retention"
	"github.com/mefor/mefor/jobs"
)

// RetentionWorker runs retention passes and audits each in
// mefor_maintenance_run with its counts.
type RetentionWorker struct {
	river.WorkerDefaults[jobs.RetentionArgs]
	Deps *Deps
	// NodeID is recorded in the audit as the node that ran the pass.
	NodeID string
	// Policy returns the retention settings in force, nil when retention
	// is not configured. It is a function so a reload takes effect at the
	// next run.
	Policy func() *config.Retention
}

// retentionTimeout bounds one run. Every batch commits on its own, so a run
// cut short loses nothing: the next one carries on. It also tells River's
// rescuer not to treat a long purge as a stuck job.
const retentionTimeout = time.Hour

func (w *RetentionWorker) Timeout(*river.Job[jobs.RetentionArgs]) time.Duration {
	return retentionTimeout
}

func (w *RetentionWorker) Work(ctx context.Context, job *river.Job[jobs.RetentionArgs]) error {
	log := w.Deps.Logger.With("job", MaintenanceRetention, "job_id", job.ID)
	run := maintenance.MaintenanceRun{Job: MaintenanceRetention, NodeID: w.NodeID, StartedAt: time.Now()}
	p := w.Policy()
	var counts retention.Counts
	var err error
	if p == nil {
		run.Detail = map[string]any{"note": "retention is not configured; nothing purged"}
	} else {
		run.Detail = map[string]any{
			"keep_bodies": p.KeepBodies.String(), "keep_dead": p.KeepDead.String(),
			"keep_errors": p.KeepErrors.String(), "delete_after": p.DeleteAfter.String(), "batch_size": p.BatchSize,
		}
		counts, err = retention.Run(ctx, w.Deps.Pool, retention.Policy{
			KeepBodies: p.KeepBodies, KeepDead: p.KeepDead, KeepErrors: p.KeepErrors, DeleteAfter: p.DeleteAfter, Batch: p.BatchSize,
		}, nil)
		run.Detail["bodies_nulled"] = counts.BodiesNulled
		run.Detail["dead_payloads_nulled"] = counts.DeadPayloadsNulled
		run.Detail["messages_deleted"] = counts.MessagesDeleted
		run.Detail["errors_deleted"] = counts.ErrorsDeleted
		run.Detail["skipped"] = counts.Skipped
		run.Detail["batches"] = counts.Batches
		if err == nil && p.KeepState > 0 {
			var n int
			n, err = purgeState(ctx, w.Deps, p)
			run.Detail["keep_state"], run.Detail["state_purged"] = p.KeepState.String(), n
		}
	}
	run.FinishedAt = time.Now()
	run.Outcome = maintenance.RunOK
	if err != nil {
		run.Outcome, run.Error = maintenance.RunFailed, err.Error()
	}
	w.Deps.Metrics.MaintenanceRun(MaintenanceRetention, run.Outcome)
	// Audit even when the run was cancelled or timed out: the batches it
	// committed are real and the operator must see why it stopped.
	if rerr := maintenance.RecordRun(context.WithoutCancel(ctx), w.Deps.Pool, run); rerr != nil {
		log.ErrorContext(ctx, "could not audit retention run", "err", rerr)
	}
	attrs := []any{"bodies_nulled", counts.BodiesNulled, "dead_payloads_nulled", counts.DeadPayloadsNulled,
		"messages_deleted", counts.MessagesDeleted, "errors_deleted", counts.ErrorsDeleted, "skipped", counts.Skipped, "batches", counts.Batches,
		"duration", run.FinishedAt.Sub(run.StartedAt).Round(time.Millisecond)}
	if err != nil {
		log.ErrorContext(ctx, "retention failed", append(attrs, "err", err)...)
		return fmt.Errorf("retention: %w", err)
	}
	log.InfoContext(ctx, "retention done", attrs...)
	return nil
}
