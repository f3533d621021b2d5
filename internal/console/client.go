package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/mefor/mefor/internal/api"
)

// apiError is an API answer other than 2xx: its status and the API's
// error body, whose text names fields and permissions, never content.
type apiError struct {
	Status     int
	Message    string `json:"error"`
	Permission string `json:"permission"`
	Field      string `json:"field"`
}

func (e *apiError) Error() string { return fmt.Sprintf("api answered %d: %s", e.Status, e.Message) }

// recorder keeps the API handler's answer in memory.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// call sends method path to the API in process, as the browser's request
// r: its cookies, its source address and its context (cancelled when the
// browser goes away). body, when not nil, is sent as JSON; csrf, when
// set, in the API's X-CSRF-Token header. A 2xx answer is decoded into out
// (when not nil); any other is returned as *apiError. The API's
// Set-Cookie headers are returned for the login and logout pages to pass
// on.
func (c *Console) call(r *http.Request, method, path string, body any, csrf string, out any) (http.Header, error) {
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode the body of %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, path, rd)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	req.RemoteAddr, req.Host, req.TLS = r.RemoteAddr, r.Host, r.TLS
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if v := r.Header.Values("Cookie"); len(v) > 0 {
		req.Header["Cookie"] = slices.Clone(v)
	}
	if csrf != "" {
		req.Header.Set(api.CSRFHeader, csrf)
	}
	rec := &recorder{header: http.Header{}}
	c.api.ServeHTTP(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.status < 200 || rec.status > 299 {
		e := &apiError{Status: rec.status}
		if json.Unmarshal(rec.body.Bytes(), e) != nil || e.Message == "" {
			e.Message = http.StatusText(rec.status)
		}
		return rec.header, e
	}
	if out != nil {
		if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
			return rec.header, fmt.Errorf("decode the answer of %s %s: %w", method, path, err)
		}
	}
	return rec.header, nil
}
