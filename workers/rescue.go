package workers

import (
	"encoding/json"
	"time"

	"github.com/riverqueue/river/rivertype"
)

// Crash accounting. A send that crashes the node (a message that makes the
// process run out of memory, a partner that trips a bug) leaves the lane's
// drainer job running on a dead node; River or reclaim rescues it and the
// next execution sends the same head again. To keep such a message from
// blocking its lane forever, every crash must count toward the destination's
// max_attempts, without a write per message on the normal path.
//
// So nothing is written before a send. Instead an execution learns whether
// it follows one that died: every rescue (River's rescuer and reclaim's
// RescueDeadNodes alike) bumps the job's river:rescue_count and appends an
// error entry, and every execution that ends cleanly records, in the job's
// output (river.RecordOutput, written by the snooze River writes anyway),
// how many rescues it had seen. An execution that finds more rescues than
// the last clean one saw follows a death: before its first send it records
// a "crashed" attempt on the lane's head, if that head was already due when
// the job was rescued (so it may have been in flight), and dead-letters it
// without sending when that attempt exhausts max_attempts. The cost is one
// write per rescue, none otherwise. A head that arrived in a lane idle when
// its node died, before the rescue, is counted too: the window is the
// node_timeout, and only a lane idle at the crash can have such a head.

// rescue is what an execution knows of the death it follows.
type rescue struct {
	// diedAt bounds when the dead execution stopped: the time of the job's
	// last error entry, the rescue. Nil if unknown.
	diedAt *time.Time
}

// cleanEnd is the output a drainer execution records when it ends cleanly.
type cleanEnd struct {
	RescuesSeen int `json:"rescues_seen"`
}

// rescueOf reads a drainer job's metadata: the rescue it follows, if any,
// and the job's rescue count.
func rescueOf(job *rivertype.JobRow) (*rescue, int) {
	var meta struct {
		RescueCount int      `json:"river:rescue_count"`
		Output      cleanEnd `json:"output"`
	}
	if len(job.Metadata) > 0 {
		_ = json.Unmarshal(job.Metadata, &meta) // a malformed field reads as zero
	}
	if meta.RescueCount <= meta.Output.RescuesSeen {
		return nil, meta.RescueCount
	}
	r := &rescue{}
	if n := len(job.Errors); n > 0 {
		at := job.Errors[n-1].At
		r.diedAt = &at
	}
	return r, meta.RescueCount
}
