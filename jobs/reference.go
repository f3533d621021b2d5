package jobs

import (
	"github.com/riverqueue/river"
)

// ReferenceSyncArgs materializes one reference set from its source into a new
// database snapshot. River's elected leader enqueues it on the set's refresh
// schedule; any node works it.
type ReferenceSyncArgs struct {
	Set string `json:"set" river:"unique"`
}

func (ReferenceSyncArgs) Kind() string { return "mefor_reference_sync" }

func (ReferenceSyncArgs) InsertOpts() river.InsertOpts {
	// Unique by set among live jobs: a slow source must not pile up syncs of
	// the same set behind each other, while different sets sync independently.
	// A failed sync is recorded and retried by the next scheduled run, not by
	// River's retries, so the source is not hammered (MaxAttempts 1).
	opts := oneLiveRun()
	opts.UniqueOpts.ByArgs = true
	return opts
}
