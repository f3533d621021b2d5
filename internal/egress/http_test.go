package egress_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/egress"
)

// counted is a real HTTP server that counts the requests it got.
type counted struct {
	*httptest.Server
	hits atomic.Int32
}

func newServer(t *testing.T, tls bool, h http.HandlerFunc) *counted {
	t.Helper()
	s := &counted{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	})
	if tls {
		s.Server = httptest.NewTLSServer(handler)
	} else {
		s.Server = httptest.NewServer(handler)
	}
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, c *http.Client, u string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), nil
}

// A redirect from https to http, or to another host, is refused: the
// server redirected to never sees a request, and the error names both ends
// without their query. A redirect within the same origin is followed.
func TestHTTPClientFollowsOnlySameOriginRedirects(t *testing.T) {
	elsewhere := newServer(t, false, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "code,loinc\n") })
	secure := newServer(t, true, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-http":
			http.Redirect(w, r, elsewhere.URL+"/codes.csv?token=s3cret", http.StatusFound)
		case "/moved":
			http.Redirect(w, r, "/codes.csv", http.StatusMovedPermanently)
		default:
			io.WriteString(w, "code,loinc\nGLU,2345-7\n")
		}
	})
	plain := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/codes.csv", http.StatusTemporaryRedirect)
	})
	tc := secure.Client().Transport.(*http.Transport).TLSClientConfig // trusts the test server's certificate
	var p *egress.Policy
	client := p.HTTPClient("reference_set:lab-codes", egress.HTTPOptions{TLS: tc})

	_, err := get(t, client, secure.URL+"/to-http")
	var re *egress.RedirectError
	if !errors.As(err, &re) {
		t.Fatalf("https → http redirect: %v, want a RedirectError", err)
	}
	// Callers report the RedirectError, not the *url.Error around it,
	// which holds the whole URL.
	if msg := re.Error(); !strings.Contains(msg, elsewhere.URL+"/codes.csv") || strings.Contains(msg, "s3cret") {
		t.Errorf("refusal should name the target without its query: %s", msg)
	}
	if _, err := get(t, p.HTTPClient("alert_sink:ops", egress.HTTPOptions{}), plain.URL); !errors.As(err, &re) {
		t.Fatalf("redirect to another host: %v, want a RedirectError", err)
	}
	if n := elsewhere.hits.Load(); n != 0 {
		t.Fatalf("the server redirected to got %d requests", n)
	}

	body, err := get(t, client, secure.URL+"/moved")
	if err != nil || !strings.Contains(body, "GLU") {
		t.Fatalf("same-origin redirect: %q, %v", body, err)
	}
}

// HTTP_PROXY and HTTPS_PROXY in the environment are not used: the proxy
// they name sees no request. A proxy given in the options is, and it is
// the proxy's address that the policy checks.
func TestHTTPClientUsesOnlyTheConfiguredProxy(t *testing.T) {
	if os.Getenv("MEFOR_EGRESS_PROXY_CHILD") == "" {
		// net/http reads the proxy variables once per process, at its
		// first use of them: run in a process of its own, so that a client
		// reading them would see the ones set below.
		cmd := exec.Command(os.Args[0], "-test.run=^TestHTTPClientUsesOnlyTheConfiguredProxy$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "MEFOR_EGRESS_PROXY_CHILD=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	proxy := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		// A forward proxy gets the absolute URL; answer for the origin.
		io.WriteString(w, "via proxy "+r.URL.Host)
	})
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("HTTPS_PROXY", proxy.URL)
	t.Setenv("http_proxy", proxy.URL)
	t.Setenv("https_proxy", proxy.URL)
	t.Setenv("NO_PROXY", "")
	// A name that resolves nowhere: only a proxy could answer for it (the
	// environment's proxy is skipped for loopback addresses anyway).
	target := "http://terminology.invalid/codes.csv"

	var none *egress.Policy
	if _, err := get(t, none.HTTPClient("reference_set:lab-codes", egress.HTTPOptions{}), target); err == nil {
		t.Fatal("a request to a name that does not resolve succeeded")
	}
	if n := proxy.hits.Load(); n != 0 {
		t.Fatalf("the environment's proxy got %d requests", n)
	}

	pu, _ := url.Parse(proxy.URL)
	body, err := get(t, none.HTTPClient("reference_set:lab-codes", egress.HTTPOptions{Proxy: pu}), target)
	if err != nil || body != "via proxy terminology.invalid" {
		t.Fatalf("through the configured proxy: %q, %v", body, err)
	}

	// The proxy's own address must be allowed: here only the origin is.
	ctx := context.Background()
	p, _ := egress.NewPolicy(ctx, parseList(t, "terminology.invalid"), nil, egress.Options{})
	_, err = get(t, p.HTTPClient("reference_set:lab-codes", egress.HTTPOptions{Proxy: pu}), target)
	if !egress.IsRefused(err) {
		t.Fatalf("through a proxy not in egress.allow: %v", err)
	}
	if n := proxy.hits.Load(); n != 1 {
		t.Fatalf("the proxy got %d requests, want only the allowed one", n)
	}
}
