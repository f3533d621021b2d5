package connector

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
)

const token = "Bearer s3cret-token"

// httpVia builds an http destination from its YAML block and sends one
// message through a pool, as a drainer does.
func httpVia(t *testing.T, block string) Result {
	t.Helper()
	cfg := adtTo(t, "hie", fmt.Sprintf(`  hie:
    type: http
    http: %s
`, block), func(k string) (string, bool) { return token, k == "HIE_TOKEN" })
	res := sendOne(t, cfg, "hie", nil)
	if strings.Contains(res.Error, "s3cret") {
		t.Errorf("a header value is in the error: %q", res.Error)
	}
	if strings.Contains(res.Error, "PID") {
		t.Errorf("message content is in the error: %q", res.Error)
	}
	return res
}

// endpoint is a real HTTP server answering with handler; it records the
// requests it got.
type endpoint struct {
	*httptest.Server
	got atomic.Int32
}

func newEndpoint(t *testing.T, tlsCert *tls.Certificate, handler http.HandlerFunc) *endpoint {
	t.Helper()
	e := &endpoint{}
	e.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.got.Add(1)
		handler(w, r)
	}))
	if tlsCert != nil {
		e.TLS = &tls.Config{Certificates: []tls.Certificate{*tlsCert}}
		e.StartTLS()
	} else {
		e.Start()
	}
	t.Cleanup(e.Close)
	return e
}

func TestHTTPDeliveredKeepsTheBody(t *testing.T) {
	ack := "MSH|^~\\&|HIE|X|A|B|20240101||ACK^A01|R1|P|2.5\rMSA|AA|C1\r"
	var gotMethod, gotAuth, gotType, gotBody string
	e := newEndpoint(t, nil, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotMethod, gotAuth, gotType, gotBody = r.Method, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)
		io.WriteString(w, ack)
	})
	res := httpVia(t, fmt.Sprintf(`{url: %q, method: PUT, headers: {Authorization: "${HIE_TOKEN}"}}`, e.URL+"/hl7?key=abc"))
	if !res.OK || res.Outcome != OutcomeDelivered || res.AckCode != "200" || string(res.Reply) != ack {
		t.Fatalf("result %+v", res)
	}
	if gotMethod != "PUT" || gotAuth != token || gotType != config.DefaultHTTPContentType || gotBody != adt {
		t.Fatalf("partner got %s, auth %q, type %q, body %q", gotMethod, gotAuth, gotType, gotBody)
	}
}

func TestHTTPFailureOutcomes(t *testing.T) {
	later := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tt := range []struct {
		name       string
		status     int
		header     string
		outcome    string
		retryAfter time.Duration // at least
	}{
		{"503 with seconds", 503, "7", OutcomeHTTPServerError, 7 * time.Second},
		{"500 without Retry-After", 500, "", OutcomeHTTPServerError, 0},
		{"429 with a date", 429, later, OutcomeHTTPThrottled, 80 * time.Second},
		{"400", 400, "", OutcomeHTTPClientError, 0},
		{"404", 404, "", OutcomeHTTPClientError, 0},
		{"redirect not followed", 302, "", OutcomeHTTPRedirect, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEndpoint(t, nil, func(w http.ResponseWriter, r *http.Request) {
				if tt.header != "" {
					w.Header().Set("Retry-After", tt.header)
				}
				if tt.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, "partner's explanation")
			})
			res := httpVia(t, fmt.Sprintf(`{url: %q, headers: {Authorization: "${HIE_TOKEN}"}}`, e.URL+"/hl7?token=abc"))
			if res.OK || res.Outcome != tt.outcome || res.AckCode != fmt.Sprint(tt.status) {
				t.Fatalf("result %+v, want outcome %s", res, tt.outcome)
			}
			if !strings.HasPrefix(res.Error, tt.outcome+": ") || !strings.Contains(res.Error, e.URL+"/hl7") || strings.Contains(res.Error, "token=abc") {
				t.Errorf("error %q should start with the outcome and name the URL without its query", res.Error)
			}
			if string(res.Reply) != "partner's explanation" {
				t.Errorf("reply %q, want the answer's body kept", res.Reply)
			}
			if res.RetryAfter < tt.retryAfter || (tt.retryAfter == 0 && res.RetryAfter != 0) || res.RetryAfter > tt.retryAfter+15*time.Second {
				t.Errorf("retry after %s, want about %s", res.RetryAfter, tt.retryAfter)
			}
			if n := e.got.Load(); n != 1 {
				t.Errorf("partner got %d requests, want 1", n)
			}
		})
	}
}

func TestHTTPTimeoutAndRefused(t *testing.T) {
	release := make(chan struct{})
	e := newEndpoint(t, nil, func(w http.ResponseWriter, r *http.Request) { <-release })
	defer close(release)
	if res := httpVia(t, fmt.Sprintf(`{url: %q, timeout: 200ms}`, e.URL)); res.Outcome != OutcomeTimeout || res.OK {
		t.Fatalf("slow partner: %+v, want timeout", res)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if res := httpVia(t, fmt.Sprintf(`{url: "http://%s/hl7"}`, addr)); res.Outcome != OutcomeRefused || res.OK {
		t.Fatalf("nothing listening: %+v, want refused", res)
	}
}

// An https partner is verified against the destination's ca_file before
// anything is sent; one that does not verify gets nothing.
func TestHTTPSVerified(t *testing.T) {
	ca, other := certtest.NewCA(t, "HIE CA"), certtest.NewCA(t, "Someone else")
	cert := ca.Issue(t, "hie", certtest.Options{}).TLS
	e := newEndpoint(t, &cert, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	dir := t.TempDir()

	res := httpVia(t, fmt.Sprintf(`{url: %q, tls: {ca_file: %q}}`, e.URL, ca.WriteFile(t, dir, "ca.crt")))
	if !res.OK || res.AckCode != "204" {
		t.Fatalf("trusted partner: %+v", res)
	}
	res = httpVia(t, fmt.Sprintf(`{url: %q, tls: {ca_file: %q}}`, e.URL, other.WriteFile(t, dir, "other.crt")))
	if res.OK || res.Outcome != OutcomeTLS || !strings.Contains(res.Error, "unknown authority") {
		t.Fatalf("untrusted partner: %+v, want outcome tls", res)
	}
	// Without a tls: block the system's roots apply, which do not know the
	// test CA either.
	if res = httpVia(t, fmt.Sprintf(`{url: %q}`, e.URL)); res.Outcome != OutcomeTLS {
		t.Fatalf("system roots: %+v, want outcome tls", res)
	}
	if n := e.got.Load(); n != 1 {
		t.Fatalf("partner handled %d requests, want only the verified one", n)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":     0,
		"0":    0,
		"-5":   0,
		"soon": 0,
		"120":  2 * time.Minute,
		" 3 ":  3 * time.Second,
		now.Add(time.Minute).Format(http.TimeFormat):  time.Minute,
		now.Add(-time.Minute).Format(http.TimeFormat): 0,
	} {
		if got, _ := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %s, want %s", v, got, want)
		}
	}
}
