// Package apiclient is a client of mefor's HTTPS operator API
// (internal/api) for the CLI's commands that go through the API instead of
// holding the database URL: MEFOR_API_URL and MEFOR_API_TOKEN name the
// node and the person. The API authenticates, checks the person's
// permissions and channel scope, and audits them; this package only
// carries the request and turns the API's JSON errors into Error.
package apiclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Options say which API to reach and as whom.
type Options struct {
	// URL is the API's base, https://host:port (MEFOR_API_URL). Plain
	// http:// is accepted only for a loopback host: a bearer token must
	// not cross a network in clear.
	URL string
	// Token is an API token (mefor token create) or a session's token
	// (MEFOR_API_TOKEN).
	Token string
	// CAFile is a PEM file of the CA that signed the API's certificate,
	// for an internal CA. Defaults to the system's roots.
	CAFile string
	// Timeout bounds one request. Defaults to 2m: an approved bulk action
	// answers once it ran.
	Timeout time.Duration
}

// Client calls the API.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
	// keep makes Do keep the answer's cookies (a login's session).
	keep    bool
	cookies []*http.Cookie
}

// New checks o and returns a client.
func New(o Options) (*Client, error) {
	if o.URL == "" {
		return nil, errors.New("no API URL: set MEFOR_API_URL or --api (e.g. https://mefor.example.org:8443)")
	}
	if o.Token == "" {
		return nil, errors.New("no API token: set MEFOR_API_TOKEN (from 'mefor token create') or --token, or log in with 'mefor login'")
	}
	return newClient(o)
}

// newClient is New without a token: for logging in.
func newClient(o Options) (*Client, error) {
	if o.URL == "" {
		return nil, errors.New("no API URL: set MEFOR_API_URL or --api (e.g. https://mefor.example.org:8443)")
	}
	u, err := url.Parse(strings.TrimRight(o.URL, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("API URL %q: want https://host:port", o.URL)
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return nil, fmt.Errorf("API URL %q: plain http sends the token in clear; use https (http only for a loopback address)", o.URL)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("API CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("API CA file %s holds no PEM certificate", o.CAFile)
		}
		tc.RootCAs = pool
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	tr := &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}
	return &Client{base: u, token: o.Token, http: &http.Client{Timeout: o.Timeout, Transport: tr}}, nil
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Error is an answer of the API that is not a 2xx: its status and what
// its JSON body says.
type Error struct {
	Status int
	// Message is the body's "error".
	Message string `json:"error"`
	// Permission names what the person lacks (a 403).
	Permission string `json:"permission,omitempty"`
	// Field names the refused field (a 422).
	Field string `json:"field,omitempty"`
	// State is an approval's state when a decision on it was refused.
	State string `json:"state,omitempty"`
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	switch {
	case e.Permission != "":
		return fmt.Sprintf("the API refused (%d, %s): %s", e.Status, e.Permission, msg)
	case e.Field != "":
		return fmt.Sprintf("the API refused (%d, field %s): %s", e.Status, e.Field, msg)
	}
	return fmt.Sprintf("the API answered %d: %s", e.Status, msg)
}

// StatusOf is the HTTP status of an Error in err's chain, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Do sends method to path (below the base, e.g. /api/v1/approvals) with
// body as JSON (nil: none), and decodes a 2xx answer into out (nil:
// discarded). It returns the status; a non-2xx answer is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("encode the request body: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return 0, fmt.Errorf("API request %s %s: %w", method, path, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("API %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if c.keep {
		c.cookies = resp.Cookies()
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("API %s %s: read the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{Status: resp.StatusCode}
		_ = json.Unmarshal(data, e)
		return resp.StatusCode, e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("API %s %s: the answer is not the JSON expected: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}
