package workers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/jobs"
)

// MaintenanceAuditForward sends the audit trail off the box
// (audit.forward).
const MaintenanceAuditForward = "audit-forward"

// auditForwardRunFor bounds one run, retries included (the next scheduled
// run carries on from the cursor). It stays well under River's rescue of
// stuck jobs (the engine's JobTimeout plus 10s, a minute or more), so a
// run is never rescued, and run again by another node, while it sends.
const auditForwardRunFor = 30 * time.Second

// AuditForwardWorker sends every audit row and anchor to the audit.forward
// targets, each from its own cursor, so a syslog receiver that is down
// does not hold up the webhook. River's elected leader enqueues it and the
// job is unique while live, so one node sends at a time (package
// auditforward says what that guarantees).
type AuditForwardWorker struct {
	river.WorkerDefaults[jobs.AuditForwardArgs]
	Deps *Deps
	// Config returns the running config; a reload applies at the next run.
	Config func() *config.Config
	// Senders returns the senders of f's targets by target, dialling
	// through the egress policy and TLS configurations in force.
	Senders func(f *config.AuditForward) map[string]auditforward.Sender
}

func (w *AuditForwardWorker) Timeout(*river.Job[jobs.AuditForwardArgs]) time.Duration {
	return auditForwardRunFor + 10*time.Second
}

func (w *AuditForwardWorker) Work(ctx context.Context, job *river.Job[jobs.AuditForwardArgs]) (err error) {
	defer func() { w.Deps.Metrics.MaintenanceRun(MaintenanceAuditForward, runOutcome(err)) }()
	return ForwardAudit(ctx, w.Deps, w.Config().Audit.Forward, w.Senders)
}

// ForwardAudit runs each target of f once, concurrently, until it has the
// whole log or fails, and forgets the cursors of targets f no longer has.
func ForwardAudit(ctx context.Context, d *Deps, f *config.AuditForward,
	senders func(*config.AuditForward) map[string]auditforward.Sender) error {
	var keep []string
	var byTarget map[string]auditforward.Sender
	if f != nil {
		byTarget = senders(f)
		for t := range byTarget {
			keep = append(keep, t)
		}
	}
	if err := auditforward.Forget(ctx, d.Pool, keep); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, auditForwardRunFor)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(keep))
	for i, target := range keep {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fw := &auditforward.Forwarder{DB: d.Pool, Target: target, Sender: byTarget[target], Batch: f.BatchSize,
				RetryMin: f.RetryMin, RetryMax: f.RetryMax, RetryFor: auditForwardRunFor, Logger: d.Logger}
			res, err := fw.Run(ctx)
			if res.Rows+res.Anchors > 0 {
				d.Logger.InfoContext(ctx, "audit forwarded", "target", target, "rows", res.Rows, "anchors", res.Anchors,
					"audit_seq", res.Cursor.Seq, "anchor_no", res.Cursor.AnchorNo)
			}
			if err != nil {
				d.Logger.WarnContext(ctx, "audit forward behind; the next run carries on from the cursor", "target", target,
					"audit_seq", res.Cursor.Seq, "error", err)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
