package workers

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/jobs"
)

// ReferenceSyncWorker materializes one reference set from its source into a
// new database snapshot. River's leader enqueues it on the set's refresh
// schedule; whichever node works it, the other nodes pick the new version up
// from the database on their next cache refresh.
type ReferenceSyncWorker struct {
	river.WorkerDefaults[jobs.ReferenceSyncArgs]
	// Config returns the running config; a set that left it is skipped.
	Config func() *config.Config
	Syncer *reference.Syncer
	// Refresh, when set, runs after a successful sync so this node serves
	// the new snapshot at once rather than at its next heartbeat.
	Refresh func(ctx context.Context)
	Logger  *slog.Logger
	// Metrics counts runs and failures; nil counts nothing.
	Metrics *metrics.Metrics
}

// Timeout covers the slowest source read plus the snapshot write.
func (w *ReferenceSyncWorker) Timeout(job *river.Job[jobs.ReferenceSyncArgs]) time.Duration {
	d := 30 * time.Second
	if set := w.Config().ReferenceSet(job.Args.Set); set != nil {
		switch {
		case set.Source.SQL != nil:
			d = set.Source.SQL.Timeout
		case set.Source.HTTP != nil:
			d = set.Source.HTTP.Timeout
		}
	}
	return d + 2*time.Minute
}

// Work syncs the set. A failed sync has already kept the last snapshot and
// recorded why (on the set and in the maintenance audit); the error is
// returned so River's job record says so too. The job is not retried: the
// next scheduled run tries again, so a broken source is not hammered.
func (w *ReferenceSyncWorker) Work(ctx context.Context, job *river.Job[jobs.ReferenceSyncArgs]) error {
	set := w.Config().ReferenceSet(job.Args.Set)
	if set == nil {
		w.Logger.WarnContext(ctx, "reference sync skipped: the set is not in the config", "set", job.Args.Set)
		return nil
	}
	res, err := w.Syncer.Sync(ctx, set)
	w.Metrics.MaintenanceRun(MaintenanceReferenceSync+set.Name, runOutcome(err))
	if err != nil {
		w.Metrics.ReferenceSyncFailed(set.Name)
		w.Logger.WarnContext(ctx, "reference sync failed; the last snapshot stays live", "set", set.Name, "error", err)
		return err
	}
	w.Logger.InfoContext(ctx, "reference set synced", "set", set.Name, "version", res.Version, "rows", res.Rows)
	if w.Refresh != nil {
		w.Refresh(ctx)
	}
	return nil
}
