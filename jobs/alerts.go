package jobs

import (
	"encoding/json"

	"github.com/riverqueue/river"
)

// QueueAlerts carries alert notifications. A queue of its own: a webhook
// that is slow or down, retried with backoff, never takes a worker slot
// from the pipeline or from maintenance.
const QueueAlerts = "mefor_alerts"

// AlertEvalArgs evaluates every alert rule once. River's elected leader
// enqueues it on alerts.interval; any node works it.
type AlertEvalArgs struct{}

func (AlertEvalArgs) Kind() string { return "mefor_alert_eval" }

func (AlertEvalArgs) InsertOpts() river.InsertOpts {
	// One live evaluation at a time; a missed one is simply the next one.
	return oneLiveRun()
}

// AlertNotifyArgs sends one notification of one rule to one sink. It is
// inserted in the transaction that records the rule's change of state, so
// a change is notified exactly when it is recorded. It names the sink, not
// its address or headers: those are read from the config when it is sent,
// so no credential is ever stored in a job.
type AlertNotifyArgs struct {
	Rule string `json:"rule"`
	Sink string `json:"sink"`
	// Seq is the rule's transition count at this change: a notification
	// waits for the rule's earlier ones to the same sink, so a receiver
	// never sees "resolved" before the "firing" it resolves.
	Seq int64 `json:"seq"`
	// State is firing or resolved.
	State string `json:"state"`
	// Payload is the JSON body sent; it holds counts and ages, never
	// message content.
	Payload json.RawMessage `json:"payload"`
}

func (AlertNotifyArgs) Kind() string { return "mefor_alert_notify" }

// alertNotifyAttempts bounds the retries of a notification; with the
// notify worker's backoff (doubling, at most 5 minutes apart) they span
// about an hour and a half.
const alertNotifyAttempts = 25

func (AlertNotifyArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueAlerts, MaxAttempts: alertNotifyAttempts}
}
