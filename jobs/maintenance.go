package jobs

import (
	"github.com/riverqueue/river"
)

// RetentionArgs runs one retention pass: purge message content past its
// retention window, keep the metadata. River's elected leader enqueues it on
// the maintenance.retention schedule; any node works it.
type RetentionArgs struct{}

func (RetentionArgs) Kind() string { return "mefor_retention" }

func (RetentionArgs) InsertOpts() river.InsertOpts {
	// One live run at a time: a manual run while the scheduled one works
	// joins it instead of racing it. A failed run is audited and the next
	// scheduled one carries on where it stopped (every batch commits), so
	// River does not retry it.
	return oneLiveRun()
}

// AuditAnchorArgs records the audit log's head as a stored anchor, signed
// with MEFOR_AUDIT_KEY when the node has it. River's elected leader
// enqueues it on the maintenance.audit_anchor schedule.
type AuditAnchorArgs struct{}

func (AuditAnchorArgs) Kind() string { return "mefor_audit_anchor" }

func (AuditAnchorArgs) InsertOpts() river.InsertOpts {
	// One live run at a time; a failed run (another node anchored at the
	// same moment) is simply taken by the next one.
	return oneLiveRun()
}

// AuditForwardArgs sends the audit trail to the audit.forward targets from
// their cursors. River's elected leader enqueues it every
// audit.forward.interval; one run at a time, so one node sends.
type AuditForwardArgs struct{}

func (AuditForwardArgs) Kind() string { return "mefor_audit_forward" }

func (AuditForwardArgs) InsertOpts() river.InsertOpts {
	// One live run at a time: two would send the same rows twice. A failed
	// run recorded its failure in the cursor and retried with backoff; the
	// next scheduled run carries on from the cursor, so River does not
	// retry it.
	return oneLiveRun()
}

// oneLiveRun is the insert options of a maintenance job that runs once at
// a time, on the maintenance queue: a run inserted while another is live
// joins it, and River does not retry a failed run (the next one carries on).
func oneLiveRun() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueMaintenance,
		MaxAttempts: 1,
		UniqueOpts:  river.UniqueOpts{ByState: liveStates},
	}
}
