package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
)

// WebhookClient is the client sink's webhook POSTs with:
// egress.Policy.HTTPClient under t's policy and TLS configuration, and the
// sink's proxy, if it names one. It is nil when the proxy does not parse
// (config refuses such a file), so the POST fails rather than go direct.
func WebhookClient(t Transport, sink *config.AlertSink) *http.Client {
	o := egress.HTTPOptions{TLS: t.TLS}
	if proxy := sink.Webhook.Proxy; proxy != "" {
		u, err := url.Parse(proxy)
		if err != nil {
			return nil
		}
		o.Proxy = u
	}
	return t.Egress.HTTPClient(Target(sink.Name), o)
}

// postWebhook sends payload to the webhook. Errors name the host and what
// went wrong, never the URL's path or query (they may carry a token) nor
// any header.
func postWebhook(ctx context.Context, client *http.Client, hook *config.WebhookSink, payload []byte) error {
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
