package auditforward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Webhook POSTs each batch as one JSON document:
//
//	{"source": "mefor", "items": [{"kind": "audit", "row": {...}}, {"kind": "anchor", "anchor": {...}}]}
//
// in order. A 2xx answer accepts the batch; anything else, or no answer,
// makes it be sent again, whole.
type Webhook struct {
	URL string
	// Client dials through the egress policy (egress.Policy.HTTPClient).
	Client *http.Client
	// Headers are sent with every POST; their values are never logged.
	Headers http.Header
	// Timeout bounds one POST. Defaults to 10s.
	Timeout time.Duration
}

// WebhookItem is one entry of a webhook batch.
type WebhookItem struct {
	Kind   string `json:"kind"`
	Row    any    `json:"row,omitempty"`
	Anchor any    `json:"anchor,omitempty"`
}

// WebhookBatch is the body of one POST.
type WebhookBatch struct {
	Source string        `json:"source"`
	Items  []WebhookItem `json:"items"`
}

// Send implements Sender.
func (w *Webhook) Send(ctx context.Context, items []Item) error {
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	batch := WebhookBatch{Source: "mefor", Items: make([]WebhookItem, 0, len(items))}
	for _, it := range items {
		if it.Row != nil {
			batch.Items = append(batch.Items, WebhookItem{Kind: "audit", Row: it.Row})
		} else {
			batch.Items = append(batch.Items, WebhookItem{Kind: "anchor", Anchor: it.Anchor})
		}
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return fmt.Errorf("encode audit batch: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("audit webhook: %w", err)
	}
	for k, vs := range w.Headers {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	client := w.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		// The url.Error names the URL; a webhook URL may carry a token in
		// its query, so only the host is reported.
		return fmt.Errorf("audit webhook %s: %w", req.URL.Host, unwrapURL(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("audit webhook %s answered %s to %d items", req.URL.Host, resp.Status, len(items))
	}
	return nil
}

// unwrapURL drops the URL a *url.Error carries.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
