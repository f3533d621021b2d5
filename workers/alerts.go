package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/notify"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
)

// Alerts.
//
// River's elected leader enqueues one evaluation every alerts.interval
// (a periodic job, like the maintenance jobs), and whichever node works it
// reads the queues, compares each rule with its row in mefor_alert and, in
// one transaction, records any change of state and inserts a notification
// job per sink. The rows are locked for that transaction, so two
// evaluations (a River leader change, a run by hand) serialize and the
// second finds the change already made: a breach fires once per cluster,
// and the state survives any node. Notifications are River jobs on their
// own queue, retried with backoff (AlertNotifyWorker): a sink that is
// down never blocks an evaluation, let alone the pipeline.

// MaintenanceAlerts is the name of the alert evaluation job.
const MaintenanceAlerts = "alerts"

// AlertEvalWorker evaluates the alert rules.
type AlertEvalWorker struct {
	river.WorkerDefaults[jobs.AlertEvalArgs]
	Deps *Deps
	// Config returns the running config; its alerts apply at the next
	// evaluation after a reload.
	Config func() *config.Config
}

func (w *AlertEvalWorker) Timeout(*river.Job[jobs.AlertEvalArgs]) time.Duration { return time.Minute }

func (w *AlertEvalWorker) Work(ctx context.Context, _ *river.Job[jobs.AlertEvalArgs]) (err error) {
	defer func() { w.Deps.Metrics.MaintenanceRun(MaintenanceAlerts, runOutcome(err)) }()
	changes, err := EvaluateAlerts(ctx, w.Deps, w.Config().Alerts, river.ClientFromContext[pgx.Tx](ctx))
	for _, c := range changes {
		w.Deps.Logger.InfoContext(ctx, "alert "+c.State, "rule", c.Rule, "condition", c.Condition, "value", c.Value, "threshold", c.Threshold)
	}
	return err
}

// Reading is one condition of a rule as measured.
type Reading = notify.Reading

// Notification is what a sink receives (notify.Notification).
type Notification = notify.Notification

// EvaluateAlerts evaluates every rule of a once and returns the changes
// of state it recorded (and notified, through ins). A nil a removes every
// rule's row.
func EvaluateAlerts(ctx context.Context, d *Deps, a *config.Alerts, ins jobs.Inserter) ([]Notification, error) {
	var rules []config.AlertRule
	if a != nil {
		rules = a.Rules
	}
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	var changes []Notification
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		changes = nil
		states, err := alert.LockAlerts(ctx, tx, names)
		if err != nil || len(rules) == 0 {
			return err
		}
		backlog, err := search.ReadBacklog(ctx, tx)
		if err != nil {
			return err
		}
		var notify []jobs.AlertNotifyArgs
		for _, r := range rules {
			st := states[r.Name]
			readings, err := measure(ctx, tx, r, backlog, st)
			if err != nil {
				return fmt.Errorf("alert rule %s: %w", r.Name, err)
			}
			var breached []Reading
			for _, rd := range readings {
				if rd.Breached() {
					breached = append(breached, rd)
				}
			}
			state, shown := st.State, Reading{}
			switch {
			case len(breached) > 0:
				state, shown = alert.AlertFiring, breached[0]
				if st.State == alert.AlertFiring {
					// Keep reporting the condition that fired while it
					// still breaches.
					for _, b := range breached {
						if b.Condition == st.Condition {
							shown = b
						}
					}
				}
			default:
				state, shown = alert.AlertOK, readings[0]
				for _, rd := range readings {
					if rd.Condition == st.Condition {
						shown = rd
					}
				}
			}
			changed := state != st.State
			row, err := alert.UpdateAlert(ctx, tx, r.Name, state, changed, shown.Condition, &shown.Value, &shown.Threshold)
			if err != nil {
				return err
			}
			if !changed {
				continue
			}
			n := Notification{
				Rule: r.Name, State: state, Destination: r.Destination, Channel: r.Channel, AuditForward: r.AuditForward,
				Condition: shown.Condition, Value: round(shown.Value), Threshold: shown.Threshold, Unit: unitOf(shown.Condition),
				Breaches: []Reading{}, Since: row.Since, At: row.Since,
			}
			if state == alert.AlertOK {
				n.State = alert.AlertResolved
			}
			for _, b := range breached {
				b.Value = round(b.Value)
				n.Breaches = append(n.Breaches, b)
			}
			n.Summary = summary(n)
			body, err := json.Marshal(n)
			if err != nil {
				return err
			}
			for _, sink := range r.Sinks {
				notify = append(notify, jobs.AlertNotifyArgs{
					Rule: r.Name, Sink: sink, Seq: row.Transitions, State: n.State, Payload: body,
				})
			}
			changes = append(changes, n)
		}
		for _, args := range notify {
			if _, err := ins.InsertTx(ctx, tx, args, nil); err != nil {
				return fmt.Errorf("enqueue alert notification of %s to %s: %w", args.Rule, args.Sink, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return changes, nil
}

// measure reads each condition rule r has, in a fixed order.
func measure(ctx context.Context, tx pgx.Tx, r config.AlertRule, b *search.Backlog, st alert.Alert) ([]Reading, error) {
	var depth int64
	var oldest float64
	if r.AuditForward != "" {
		lag, err := auditforward.LagOf(ctx, tx, r.AuditForward)
		if err != nil {
			return nil, err
		}
		depth, oldest = lag.Rows, lag.OldestSeconds
	}
	for _, g := range b.Groups {
		if r.AuditForward != "" {
			break
		}
		var mine bool
		if r.Destination != "" {
			mine = g.Stage == jobs.StageOutbound && g.Destination == r.Destination
		} else {
			mine = g.Stage != jobs.StageOutbound && g.Channel == r.Channel
		}
		if mine {
			depth += g.Pending
			oldest = max(oldest, g.OldestSeconds)
		}
	}
	var out []Reading
	if r.OldestQueued > 0 {
		out = append(out, Reading{Condition: config.ConditionOldestQueued, Value: oldest, Threshold: r.OldestQueued.Seconds()})
	}
	if r.QueueDepth > 0 {
		out = append(out, Reading{Condition: config.ConditionQueueDepth, Value: float64(depth), Threshold: float64(r.QueueDepth)})
	}
	if r.DeadLetters > 0 {
		n, err := alert.CountDead(ctx, tx, r.Destination, r.Channel)
		if err != nil {
			return nil, err
		}
		out = append(out, Reading{Condition: config.ConditionDeadLetters, Value: float64(n), Threshold: float64(r.DeadLetters)})
	}
	if r.Tampered > 0 {
		n, err := alert.CountTampered(ctx, tx, r.Destination, r.Channel)
		if err != nil {
			return nil, err
		}
		out = append(out, Reading{Condition: config.ConditionTampered, Value: float64(n), Threshold: float64(r.Tampered)})
	}
	if r.NoTraffic > 0 {
		secs, ok, err := alert.SecondsSinceTraffic(ctx, tx, r.Destination, r.Channel)
		if err != nil {
			return nil, err
		}
		if !ok {
			// Never any traffic: count from when the rule was first
			// evaluated (its row's creation), not from the epoch.
			secs = time.Since(st.Since).Seconds()
		}
		out = append(out, Reading{Condition: config.ConditionNoTraffic, Value: secs, Threshold: r.NoTraffic.Seconds()})
	}
	return out, nil
}

func unitOf(condition string) string {
	switch condition {
	case config.ConditionOldestQueued, config.ConditionNoTraffic:
		return "seconds"
	}
	return "rows"
}

func round(v float64) float64 { return math.Round(v*1000) / 1000 }

// summary is the notification in one sentence, for chat hooks and logs.
func summary(n Notification) string {
	what := "destination " + n.Destination
	switch {
	case n.AuditForward != "":
		what = "audit forward to " + n.AuditForward
	case n.Channel != "":
		what = "channel " + n.Channel
	}
	var cond string
	switch n.Condition {
	case config.ConditionOldestQueued:
		cond = fmt.Sprintf("oldest queued row is %s old (threshold %s)", secs(n.Value), secs(n.Threshold))
	case config.ConditionQueueDepth:
		cond = fmt.Sprintf("%.0f rows queued (threshold %.0f)", n.Value, n.Threshold)
	case config.ConditionDeadLetters:
		cond = fmt.Sprintf("%.0f dead letters (threshold %.0f)", n.Value, n.Threshold)
	case config.ConditionTampered:
		cond = fmt.Sprintf("%.0f rows dead-lettered as tampered, never sent (threshold %.0f)", n.Value, n.Threshold)
	case config.ConditionNoTraffic:
		cond = fmt.Sprintf("no traffic for %s (threshold %s)", secs(n.Value), secs(n.Threshold))
	}
	return fmt.Sprintf("%s %s: %s, %s", n.Rule, n.State, what, cond)
}

func secs(v float64) string {
	return (time.Duration(v) * time.Second).Round(time.Second).String()
}
