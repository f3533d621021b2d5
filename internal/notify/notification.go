package notify

import "time"

// Notification is what a sink receives, as JSON for a webhook: it names the
// rule, what it watches, the state and the condition's value and threshold
// (seconds for ages, counts otherwise). It never holds message content.
type Notification struct {
	Rule        string `json:"rule"`
	State       string `json:"state"`
	Destination string `json:"destination,omitempty"`
	Channel     string `json:"channel,omitempty"`
	// AuditForward is the audit.forward target (syslog, webhook) of a
	// rule watching one: its queue is the audit rows not yet accepted.
	AuditForward string `json:"audit_forward,omitempty"`
	// Condition, Value and Threshold are the condition that breached: on
	// resolved, the one that had fired, with its value now.
	Condition string  `json:"condition"`
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	Unit      string  `json:"unit"`
	// Breaches lists every condition breaching now (empty on resolved).
	Breaches []Reading `json:"breaches"`
	// Since is when the rule entered State; At is the evaluation.
	Since   time.Time `json:"since"`
	At      time.Time `json:"at"`
	Summary string    `json:"summary"`
}

// Reading is one condition of a rule as measured.
type Reading struct {
	Condition string  `json:"condition"`
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
}

// Breached reports whether the reading breaches its threshold.
func (r Reading) Breached() bool { return r.Value >= r.Threshold }

// StateTest is the state of the notification `mefor alerts test` sends.
const StateTest = "test"

// TestRule is the rule name of that notification.
const TestRule = "alerts-test"

// Test is the notification `mefor alerts test` sends to sink: no rule
// fired, and it says so.
func Test(sink string, at time.Time) Notification {
	return Notification{Rule: TestRule, State: StateTest, Breaches: []Reading{}, Since: at, At: at,
		Summary: "test notification to sink " + sink + " from mefor alerts test; no rule is firing"}
}

// watched names what n's rule watches, e.g. "destination lab".
func (n *Notification) watched() string {
	switch {
	case n.AuditForward != "":
		return "audit forward to " + n.AuditForward
	case n.Channel != "":
		return "channel " + n.Channel
	case n.Destination != "":
		return "destination " + n.Destination
	}
	return ""
}
