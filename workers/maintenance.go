package workers

import (
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/jobs"
)

// MaintenanceJob is one of the periodic jobs River's elected leader enqueues
// and any node works. The node's River PeriodicJobs and the `mefor
// maintenance` commands are both built from MaintenanceJobs, so what an
// operator lists and runs is exactly what the cluster schedules.
type MaintenanceJob struct {
	// Name is what operators call the job: "reclaim", "retention",
	// "reference-sync:<set>". Runs are audited under it.
	Name string
	// Schedule says when the leader enqueues it; the zero Schedule means
	// only when run by hand.
	Schedule config.Schedule
	// Args is what is inserted to run it.
	Args river.JobArgs
	// RunOnStart enqueues a run as soon as a node becomes River's leader.
	RunOnStart bool
	// Audited says its runs are recorded in mefor_maintenance_run.
	// Reclaim's are not: it runs every few seconds and its effects show in
	// the lanes themselves.
	Audited bool
}

// Job names.
const (
	MaintenanceReclaim   = "reclaim"
	MaintenanceRetention = "retention"
	// MaintenanceAuditAnchor signs the audit log's head
	// (maintenance.audit_anchor).
	MaintenanceAuditAnchor = "audit-anchor"
	// MaintenanceReferenceSync prefixes the name of each reference set's
	// sync job.
	MaintenanceReferenceSync = "reference-sync:"
)

// MaintenanceJobs lists the maintenance jobs of cfg in a stable order:
// reclaim, retention (which a parsed config always has: keep_errors applies
// without a retention block), the audit anchor, the audit forward when the
// config has audit.forward, the alert evaluation when the config has
// alerts, then one reference sync per reference set in file order.
func MaintenanceJobs(cfg *config.Config) []MaintenanceJob {
	list := []MaintenanceJob{{
		Name:     MaintenanceReclaim,
		Schedule: cfg.Maintenance.Reclaim.Schedule,
		Args:     jobs.ReclaimArgs{},
		// Stranded lanes should not wait a full period after a failover.
		RunOnStart: true,
	}}
	if r := cfg.Maintenance.Retention; r != nil {
		list = append(list, MaintenanceJob{
			Name: MaintenanceRetention, Schedule: r.Schedule, Args: jobs.RetentionArgs{}, Audited: true,
		})
	}
	list = append(list, MaintenanceJob{
		Name: MaintenanceAuditAnchor, Schedule: cfg.Maintenance.AuditAnchor.Schedule, Args: jobs.AuditAnchorArgs{},
		// A new leader anchors at once: the previous one may have died
		// just before its next anchor.
		RunOnStart: true,
	})
	if f := cfg.Audit.Forward; f != nil {
		list = append(list, MaintenanceJob{
			Name: MaintenanceAuditForward, Schedule: config.Every(f.Interval), Args: jobs.AuditForwardArgs{},
			// A new leader catches up at once.
			RunOnStart: true,
		})
	}
	if a := cfg.Alerts; a != nil {
		list = append(list, MaintenanceJob{
			Name: MaintenanceAlerts, Schedule: config.Every(a.Interval), Args: jobs.AlertEvalArgs{}, RunOnStart: true,
		})
	}
	for _, set := range cfg.ReferenceSets {
		list = append(list, MaintenanceJob{
			Name:     MaintenanceReferenceSync + set.Name,
			Schedule: set.Refresh,
			Args:     jobs.ReferenceSyncArgs{Set: set.Name},
			Audited:  true,
		})
	}
	return list
}

// FindMaintenanceJob returns the job of cfg called name.
func FindMaintenanceJob(cfg *config.Config, name string) (MaintenanceJob, bool) {
	for _, j := range MaintenanceJobs(cfg) {
		if j.Name == name {
			return j, true
		}
	}
	return MaintenanceJob{}, false
}

// PeriodicJobs turns the scheduled jobs of list into River periodic jobs,
// each identified by its name so River keeps one schedule per job.
func PeriodicJobs(list []MaintenanceJob) []*river.PeriodicJob {
	var out []*river.PeriodicJob
	for _, j := range list {
		if j.Schedule.IsZero() {
			continue
		}
		args := j.Args
		out = append(out, river.NewPeriodicJob(j.Schedule,
			func() (river.JobArgs, *river.InsertOpts) { return args, nil },
			&river.PeriodicJobOpts{ID: j.Name, RunOnStart: j.RunOnStart}))
	}
	return out
}
