package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/apiclient"
	"github.com/mefor/mefor/ops"
)

// maxAPILimit is the most rows one API listing answers (api.maxListLimit).
const maxAPILimit = 1000

// read runs a read through the API when the command goes through it
// (api), else on the database (db).
func read[T any](ctx context.Context, g *Globals, api func(*apiclient.Client) (T, error), db func(context.Context, *pgxpool.Pool) (T, error)) (T, error) {
	cl, err := g.remote()
	if err != nil {
		var zero T
		return zero, err
	}
	if cl != nil {
		return api(cl)
	}
	return query(ctx, g, db)
}

// getField GETs path and decodes the answer's field key, the list every
// listing endpoint wraps ({"nodes": [...]}).
func getField[T any](ctx context.Context, cl *apiclient.Client, path, key string) (T, error) {
	var out map[string]json.RawMessage
	var v T
	if _, err := cl.Do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return v, err
	}
	if raw, ok := out[key]; ok {
		if err := json.Unmarshal(raw, &v); err != nil {
			return v, fmt.Errorf("the API's %s are not the JSON expected: %w", key, err)
		}
	}
	return v, nil
}

// apiLimit refuses a limit one API answer cannot hold.
func apiLimit(limit int) error {
	if limit > maxAPILimit {
		return fmt.Errorf("--limit: at most %d through the API", maxAPILimit)
	}
	return nil
}

// apiTime is a time bound as the API takes it.
func apiTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// messageSearch is the body of POST /api/v1/messages/search.
type messageSearch struct {
	Channel     string `json:"channel,omitempty"`
	Destination string `json:"destination,omitempty"`
	Status      string `json:"status,omitempty"`
	ControlID   string `json:"control_id,omitempty"`
	Patient     string `json:"patient,omitempty"`
	Text        string `json:"text,omitempty"`
	Type        string `json:"type,omitempty"`
	Since       string `json:"since,omitempty"`
	Until       string `json:"until,omitempty"`
	Limit       int    `json:"limit,omitempty"`
	Cursor      string `json:"cursor,omitempty"`
}

// apiMessages lists messages through the API, a page of at most 1000 at a
// time until limit. A patient identifier or a text to find is content, so
// it goes in a POST body, never in the URL.
func apiMessages(ctx context.Context, cl *apiclient.Client, f messageSearch, limit int) ([]ops.MessageSummary, error) {
	var all []ops.MessageSummary
	for {
		f.Limit = min(limit-len(all), maxAPILimit)
		var page struct {
			Messages []ops.MessageSummary `json:"messages"`
			Next     *string              `json:"next"`
		}
		var err error
		if f.Patient != "" || f.Text != "" {
			_, err = cl.Do(ctx, http.MethodPost, "/api/v1/messages/search", f, &page)
		} else {
			_, err = cl.Do(ctx, http.MethodGet, "/api/v1/messages?"+f.query().Encode(), nil, &page)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, page.Messages...)
		if page.Next == nil || len(all) >= limit {
			return all, nil
		}
		f.Cursor = *page.Next
	}
}

// query is f as GET /api/v1/messages's query string (no patient, no text).
func (f messageSearch) query() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("channel", f.Channel)
	set("destination", f.Destination)
	set("status", f.Status)
	set("control_id", f.ControlID)
	set("type", f.Type)
	set("since", f.Since)
	set("until", f.Until)
	set("cursor", f.Cursor)
	if f.Limit > 0 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	return v
}

// apiFindMessage is ops.FindMessage through the API: ref is a message's
// id when a message the person sees has it, else its control id. A
// message out of their channels is not found, as through the API
// everywhere.
func apiFindMessage(ctx context.Context, cl *apiclient.Client, ref string) (id int64, matches, also []ops.MessageSummary, err error) {
	const most = 20
	byControl, err := apiMessages(ctx, cl, messageSearch{ControlID: ref}, most)
	if err != nil {
		return 0, nil, nil, err
	}
	if n, perr := strconv.ParseInt(ref, 10, 64); perr == nil && n > 0 {
		_, gerr := cl.Do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/messages/%d", n), nil, nil)
		switch {
		case gerr == nil:
			for _, m := range byControl {
				if m.ID != n {
					also = append(also, m)
				}
			}
			return n, nil, also, nil
		case apiclient.StatusOf(gerr) != http.StatusNotFound:
			return 0, nil, nil, gerr
		}
	}
	if len(byControl) == 1 {
		return byControl[0].ID, nil, nil, nil
	}
	return 0, byControl, nil, nil
}

// apiBody is GET /api/v1/messages/{id}/body.
type apiBody struct {
	Raw     *string `json:"raw"`
	Replies []struct {
		ID   int64   `json:"id"`
		Body *string `json:"body"`
	} `json:"replies"`
	Outbound []struct {
		WorkID  int64   `json:"work_id"`
		Payload *string `json:"payload"`
	} `json:"outbound"`
}

// apiShowMessage is ops.ShowMessage through the API: the message's view,
// and with withBody its content (the API audits that read as the person).
func apiShowMessage(ctx context.Context, cl *apiclient.Client, id int64, withBody bool) (*ops.MessageView, error) {
	var v ops.MessageView
	if _, err := cl.Do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/messages/%d", id), nil, &v); err != nil {
		if apiclient.StatusOf(err) == http.StatusNotFound {
			return nil, ops.ErrNotFound
		}
		return nil, err
	}
	if !withBody {
		return &v, nil
	}
	var b apiBody
	if _, err := cl.Do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/messages/%d/body", id), nil, &b); err != nil {
		if apiclient.StatusOf(err) == http.StatusNotFound {
			return nil, ops.ErrNotFound
		}
		return nil, err
	}
	if b.Raw != nil {
		v.Message.Raw = []byte(*b.Raw)
	}
	replies := map[int64][]byte{}
	for _, r := range b.Replies {
		if r.Body != nil {
			replies[r.ID] = []byte(*r.Body)
		}
	}
	for i := range v.Replies {
		v.Replies[i].Body = replies[v.Replies[i].ID]
	}
	payloads := map[int64][]byte{}
	for _, o := range b.Outbound {
		if o.Payload != nil {
			payloads[o.WorkID] = []byte(*o.Payload)
		}
	}
	for _, w := range v.Work {
		if w.Stage == "outbound" {
			v.Outbound = append(v.Outbound, ops.Outbound{WorkID: w.ID, Destination: w.Destination, Lane: w.Lane,
				Status: w.Status, Attempts: w.Attempts, Payload: payloads[w.ID]})
		}
	}
	return &v, nil
}

// errNotThroughAPI is a flag the API does not take.
func errNotThroughAPI(flag, why string) error {
	return &exitError{code: 2, err: errors.New(flag + " is not available through the API: " + why)}
}
