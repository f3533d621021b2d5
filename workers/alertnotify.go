package workers

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/jobs"
)

// AlertNotifyWorker sends one alert notification to one sink: a webhook
// POST, or a line of this node's log. A failed POST returns an error, so
// River retries it with this worker's backoff (NextRetry); the outcome of
// each attempt is recorded on the rule for `mefor alerts list`. Header
// values (credentials) are read from the config at send time and never
// logged, recorded or put into an error.
type AlertNotifyWorker struct {
	river.WorkerDefaults[jobs.AlertNotifyArgs]
	Pool   *pgxpool.Pool
	Config func() *config.Config
	Logger *slog.Logger
	// Client returns the client a sink's webhook POSTs with (a node's:
	// WebhookClient under its egress policy, with the sink's TLS
	// configuration); nil means WebhookClient without a policy or a tls:
	// block. Each sink's timeout bounds each POST.
	Client func(sink *config.AlertSink) *http.Client
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
	var client *http.Client
	switch {
	case sink == nil || sink.Webhook == nil:
	case w.Client != nil:
		client = w.Client(sink)
	default:
		client = WebhookClient(nil, nil, sink)
	}
	if sink == nil {
		w.Logger.WarnContext(ctx, "alert notification dropped: its sink is no longer in the config", "rule", a.Rule, "sink", a.Sink, "state", a.State)
		return alert.RecordNotification(ctx, w.Pool, a.Rule, a.Sink, a.State, "sink no longer in the config; not sent")
	}
	switch {
	case sink.Log != nil:
		w.logNotification(ctx, sink, a)
	case sink.Webhook != nil:
		if err := w.post(ctx, client, sink.Webhook, a.Payload); err != nil {
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
	}
	return alert.RecordNotification(ctx, w.Pool, a.Rule, a.Sink, a.State, "")
}

// WebhookTarget is how an alert sink is named in egress refusals and in
// mefor_egress_refused_total.
func WebhookTarget(sink string) string { return "alert_sink:" + sink }

// WebhookClient is the client sink's webhook POSTs with under policy p
// (nil: anywhere): egress.Policy.HTTPClient with tc, the sink's TLS
// configuration (nil: the system's roots), and its proxy, if it names
// one. It is nil when the proxy does not parse (config refuses such a
// file), so the POST fails rather than go direct.
func WebhookClient(p *egress.Policy, tc *tls.Config, sink *config.AlertSink) *http.Client {
	o := egress.HTTPOptions{TLS: tc}
	if proxy := sink.Webhook.Proxy; proxy != "" {
		u, err := url.Parse(proxy)
		if err != nil {
			return nil
		}
		o.Proxy = u
	}
	return p.HTTPClient(WebhookTarget(sink.Name), o)
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

func (w *AlertNotifyWorker) logNotification(ctx context.Context, sink *config.AlertSink, a jobs.AlertNotifyArgs) {
	level := slog.LevelWarn
	_ = level.UnmarshalText([]byte(sink.Log.Level))
	var n Notification
	if err := json.Unmarshal(a.Payload, &n); err != nil {
		w.Logger.Log(ctx, level, "alert "+a.State, "rule", a.Rule, "sink", a.Sink)
		return
	}
	attrs := []any{"rule", a.Rule, "sink", a.Sink, "state", n.State, "condition", n.Condition,
		"value", n.Value, "threshold", n.Threshold, "unit", n.Unit, "since", n.Since, "summary", n.Summary}
	switch {
	case n.AuditForward != "":
		attrs = append(attrs, "audit_forward", n.AuditForward)
	case n.Destination != "":
		attrs = append(attrs, "destination", n.Destination)
	default:
		attrs = append(attrs, "channel", n.Channel)
	}
	w.Logger.Log(ctx, level, "alert "+a.State, attrs...)
}

// post sends payload to the webhook. Errors name the host and what went
// wrong, never the URL's path or query (they may carry a token) nor any
// header.
func (w *AlertNotifyWorker) post(ctx context.Context, client *http.Client, hook *config.WebhookSink, payload []byte) error {
	if client == nil {
		return errors.New("no HTTP client for the webhook (its proxy does not parse)")
	}
	u, err := url.Parse(hook.URL)
	if err != nil {
		return errors.New("the webhook URL does not parse")
	}
	ctx, cancel := context.WithTimeout(ctx, hook.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hook.URL, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("build POST to %s: %w", u.Host, errors.Unwrap(err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "mefor-alerts")
	for _, h := range hook.Headers {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("POST to %s: no answer within %s", u.Host, hook.Timeout)
		}
		return fmt.Errorf("POST to %s: %w", u.Host, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("POST to %s: answered %s", u.Host, resp.Status)
	}
	return nil
}
