package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/notify"
	"github.com/mefor/mefor/jobs"
)

// AlertNotifyWorker sends one alert notification to one sink (a webhook
// POST, a mail, a syslog message, or a line of this node's log) through
// notify.Sender, as `mefor alerts test` does. A failed send returns an
// error, so River retries it with this worker's backoff (NextRetry); the
// outcome of each attempt is recorded on the rule for `mefor alerts list`.
// Secrets (header values, the SMTP password) are read from the config at
// send time and never logged, recorded or put into an error.
type AlertNotifyWorker struct {
	river.WorkerDefaults[jobs.AlertNotifyArgs]
	Pool   *pgxpool.Pool
	Config func() *config.Config
	Logger *slog.Logger
	// Transport returns how a sink connects (a node's: its egress policy
	// and the sink's TLS configuration, notify.TransportOf); nil connects
	// without a policy or a tls: block. Each sink's timeout bounds each
	// send.
	Transport func(sink *config.AlertSink) notify.Transport
	// Hostname names this node in syslog messages.
	Hostname string
	// RetryBase is the wait before the first retry; each retry doubles it,
	// up to RetryMax. Defaults to 1s and 5m.
	RetryBase, RetryMax time.Duration
}

// waitForEarlier is how long a notification waits when an earlier one of
// its rule to the same sink is still queued or being retried.
const waitForEarlier = time.Second

func (w *AlertNotifyWorker) Timeout(*river.Job[jobs.AlertNotifyArgs]) time.Duration {
	return 2 * time.Minute
}

// NextRetry doubles the wait after each failed attempt, from RetryBase up
// to RetryMax.
func (w *AlertNotifyWorker) NextRetry(job *river.Job[jobs.AlertNotifyArgs]) time.Time {
	base, most := w.RetryBase, w.RetryMax
	if base <= 0 {
		base = time.Second
	}
	if most <= 0 {
		most = 5 * time.Minute
	}
	wait := base
	for i := 1; i < job.Attempt && wait < most; i++ {
		wait *= 2
	}
	return time.Now().Add(min(wait, most))
}

func (w *AlertNotifyWorker) Work(ctx context.Context, job *river.Job[jobs.AlertNotifyArgs]) error {
	a := job.Args
	earlier, err := w.earlierPending(ctx, job)
	if err != nil {
		return err
	}
	if earlier {
		return river.JobSnooze(waitForEarlier)
	}
	sink := w.Config().Alerts.Sink(a.Sink)
	if sink == nil {
		w.Logger.WarnContext(ctx, "alert notification dropped: its sink is no longer in the config", "rule", a.Rule, "sink", a.Sink, "state", a.State)
		return alert.RecordNotification(ctx, w.Pool, a.Rule, a.Sink, a.State, "sink no longer in the config; not sent")
	}
	sender := &notify.Sender{Logger: w.Logger, Transport: w.Transport, Hostname: w.Hostname}
	if err := sender.Send(ctx, sink, a.Payload); err != nil {
		err = fmt.Errorf("alert %s %s to sink %s, attempt %d of %d: %w", a.Rule, a.State, a.Sink, job.Attempt, job.MaxAttempts, err)
		final := job.Attempt >= job.MaxAttempts
		note := err.Error()
		if !final {
			note += " (will retry)"
		}
		if rerr := alert.RecordNotification(ctx, w.Pool, a.Rule, a.Sink, a.State, note); rerr != nil {
			w.Logger.WarnContext(ctx, "could not record a failed alert notification", "rule", a.Rule, "error", rerr)
		}
		w.Logger.WarnContext(ctx, "alert notification failed", "rule", a.Rule, "sink", a.Sink, "state", a.State,
			"attempt", job.Attempt, "final", final, "error", err)
		return err
	}
	return alert.RecordNotification(ctx, w.Pool, a.Rule, a.Sink, a.State, "")
}

// earlierPending reports whether a notification of the same rule to the
// same sink from an earlier change is still live: this one waits for it,
// so a receiver sees the changes in order.
func (w *AlertNotifyWorker) earlierPending(ctx context.Context, job *river.Job[jobs.AlertNotifyArgs]) (bool, error) {
	earlier, err := jobs.EarlierNotificationPending(ctx, w.Pool, job.Kind, job.ID, job.Args.Rule, job.Args.Sink, job.Args.Seq)
	if err != nil {
		return false, fmt.Errorf("look for earlier notifications of alert %s: %w", job.Args.Rule, err)
	}
	return earlier, nil
}
