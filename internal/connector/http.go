package connector

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/tlsconf"
)

// Outcomes of an HTTP destination's attempts, besides delivered, refused,
// timeout, closed and tls.
const (
	OutcomeHTTPServerError = "http-5xx" // the partner failed; retried
	OutcomeHTTPThrottled   = "http-429" // too many requests; retried after Retry-After
	OutcomeHTTPClientError = "http-4xx" // the partner refuses the request; see on_client_error
	OutcomeHTTPRedirect    = "http-3xx" // the url points elsewhere; retried, fix the url
)

// maxHTTPReply bounds the answer body read and kept: query responses can be
// large, an endless body must not exhaust memory.
const maxHTTPReply = 16 << 20

// HTTPSender sends each message as the body of one request. Its errors show
// the URL without its query (which may carry a token) and never a header.
type HTTPSender struct {
	url     string
	shown   string // scheme://host/path, for errors
	method  string
	headers http.Header
	timeout time.Duration
	tr      *http.Transport
	client  *http.Client
}

func newHTTPSender(dest *config.Destination, tc *tlsconf.Client, dial egress.DialFunc) (*HTTPSender, error) {
	h := dest.HTTP
	u, err := url.Parse(h.URL)
	if err != nil {
		return nil, fmt.Errorf("destination %q: url: %w", dest.Name, err)
	}
	s := &HTTPSender{url: h.URL, shown: u.Scheme + "://" + u.Host + u.EscapedPath(), method: h.Method,
		headers: http.Header{}, timeout: h.Timeout}
	for _, hd := range h.Headers {
		s.headers.Set(hd.Name, hd.Value)
	}
	if s.headers.Get("Content-Type") == "" {
		s.headers.Set("Content-Type", config.DefaultHTTPContentType)
	}
	tlsConfig := func() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()} }
	if h.TLS.Enabled {
		if tc == nil {
			return nil, fmt.Errorf("destination %q: TLS is configured but its certificates were not loaded", dest.Name)
		}
		tlsConfig = tc.Config
	}
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	dialTLS := mllp.TLSDialerVia(dial, tlsConfig)
	s.tr = &http.Transport{
		// Messages go straight to the partner: a proxy from the
		// environment would see them.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, &mllp.DialError{Addr: addr, Err: err}
			}
			return c, nil
		},
		// The TLS dial of the MLLP destinations: the handshake verified
		// before anything is written, the certificates read at each
		// connection so that renewed files apply without a restart.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialTLS(ctx, network, addr)
			var he *mllp.HandshakeError
			if err != nil && !errors.As(err, &he) {
				return nil, &mllp.DialError{Addr: addr, Err: err}
			}
			return c, err
		},
		// One lane sends one request at a time.
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
	}
	s.client = &http.Client{
		Transport: s.tr,
		// A redirect of a POST may be replayed as a GET, or to a host the
		// operator never named: report it instead of following it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s, nil
}

// Send sends one message and classifies the answer.
func (s *HTTPSender) Send(ctx context.Context, d Delivery) Result {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, s.method, s.url, bytes.NewReader(d.Payload))
	if err != nil {
		return Result{Outcome: OutcomeInternal, Error: fmt.Sprintf("%s: request to %s: cannot be built", OutcomeInternal, s.shown)}
	}
	req.Header = s.headers.Clone()
	resp, err := s.client.Do(req)
	if err != nil {
		return s.classify(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPReply+1))
	if err != nil {
		res := s.classify(err)
		if res.Outcome == OutcomeInternal || res.Outcome == OutcomeClosed {
			res = Result{Outcome: OutcomeClosed, Error: fmt.Sprintf("%s: %s answered %d but the answer broke off; the partner may have the message",
				OutcomeClosed, s.shown, resp.StatusCode)}
		}
		return res
	}
	if len(body) > maxHTTPReply {
		body = nil // not kept rather than kept cut: a cut reply would be routed as a broken message
	}
	code := resp.StatusCode
	status := fmt.Sprintf("%d %s", code, http.StatusText(code))
	res := Result{AckCode: strconv.Itoa(code), Reply: body}
	switch {
	case code >= 200 && code < 300:
		res.OK, res.Outcome = true, OutcomeDelivered
		return res
	case code == http.StatusTooManyRequests:
		res.Outcome = OutcomeHTTPThrottled
	case code >= 500:
		res.Outcome = OutcomeHTTPServerError
	case code >= 400:
		res.Outcome = OutcomeHTTPClientError
		res.Error = fmt.Sprintf("%s: %s answered %s (the partner refuses the request)", res.Outcome, s.shown, status)
		return res
	case code >= 300:
		res.Outcome = OutcomeHTTPRedirect
		res.Error = fmt.Sprintf("%s: %s answered %s; mefor does not follow redirects, set url to the final address", res.Outcome, s.shown, status)
		return res
	default:
		res.Outcome = OutcomeInternal
		res.Error = fmt.Sprintf("%s: %s answered %s", res.Outcome, s.shown, status)
		return res
	}
	res.Error = fmt.Sprintf("%s: %s answered %s", res.Outcome, s.shown, status)
	if ra, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		res.RetryAfter = ra
		res.Error += fmt.Sprintf(" (Retry-After %s)", ra)
	}
	return res
}

func (s *HTTPSender) classify(err error) Result {
	var (
		dial    *mllp.DialError
		hs      *mllp.HandshakeError
		ne      net.Error
		refused *egress.RefusedError
	)
	switch {
	case errors.As(err, &refused):
		return Result{Outcome: OutcomeEgress, Error: fmt.Sprintf("%s: %s; nothing was delivered", OutcomeEgress, refused.Detail())}
	case errors.As(err, &hs):
		return Result{Outcome: OutcomeTLS, Error: fmt.Sprintf("%s: TLS handshake with %s failed, %s; nothing was delivered (%v)",
			OutcomeTLS, s.shown, hs.Reason, hs.Err)}
	case errors.As(err, &dial) && errors.Is(err, syscall.ECONNREFUSED):
		return Result{Outcome: OutcomeRefused, Error: fmt.Sprintf("%s: connection refused by %s", OutcomeRefused, s.shown)}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return Result{Outcome: OutcomeTimeout, Error: fmt.Sprintf("%s: no answer from %s within %s", OutcomeTimeout, s.shown, s.timeout)}
	case errors.As(err, &dial):
		return Result{Outcome: OutcomeRefused, Error: fmt.Sprintf("%s: cannot connect to %s: %v", OutcomeRefused, s.shown, dial.Err)}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return Result{Outcome: OutcomeClosed, Error: fmt.Sprintf("%s: %s closed the connection before answering", OutcomeClosed, s.shown)}
	}
	// A *url.Error's text holds the whole URL, query included.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return Result{Outcome: OutcomeInternal, Error: fmt.Sprintf("%s: request to %s: %v", OutcomeInternal, s.shown, err)}
}

// Close closes the idle connection.
func (s *HTTPSender) Close() error {
	s.tr.CloseIdleConnections()
	return nil
}

// retryAfter reads a Retry-After header: a number of seconds or an HTTP
// date. ok is false when there is none, it does not read, or it asks for no
// wait at all (the retry policy's backoff applies then).
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(365*24*time.Hour/time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now), true
	}
	return 0, false
}

// httpKey is what an HTTP sender is built from, for Pool.Get: a reload that
// changes any of it (a rotated token, too) gets a new sender.
func httpKey(h *config.HTTPDestination) string {
	if h == nil {
		return ""
	}
	return fmt.Sprintf("%q %q %d %q %+v", h.URL, h.Method, h.Timeout, h.Headers, h.TLS)
}
