package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/jobs"
)

// AuditAnchorWorker records the audit log's head as a stored anchor, signed
// with Keys, so that `mefor audit verify` later catches rows rewritten,
// inserted or deleted before it (with the key) and rows cut off the end
// (with or without it), with nobody having to remember `mefor audit anchor`.
type AuditAnchorWorker struct {
	river.WorkerDefaults[jobs.AuditAnchorArgs]
	Deps *Deps
	// NodeID is recorded in the anchor.
	NodeID string
	// Keys signs the anchors (MEFOR_AUDIT_KEY); nil takes them unsigned,
	// which still catches a cut tail but not a superuser's rewrite.
	Keys *audit.Keys
}

func (w *AuditAnchorWorker) Timeout(*river.Job[jobs.AuditAnchorArgs]) time.Duration {
	return time.Minute
}

func (w *AuditAnchorWorker) Work(ctx context.Context, job *river.Job[jobs.AuditAnchorArgs]) (err error) {
	defer func() { w.Deps.Metrics.MaintenanceRun(MaintenanceAuditAnchor, runOutcome(err)) }()
	a, took, err := audit.TakeAnchor(ctx, w.Deps.Pool, w.Keys, w.NodeID)
	if err != nil {
		w.Deps.Logger.WarnContext(ctx, "audit anchor not taken; the next run takes it", "job_id", job.ID, "err", err)
		return err
	}
	if took {
		w.Deps.Logger.InfoContext(ctx, "audit anchor taken", "anchor", a.No, "audit_seq", a.Seq,
			"signed", a.MAC != "", "key_id", a.KeyID)
	}
	return nil
}
