package egress

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// HTTPOptions are an HTTP client's own settings.
type HTTPOptions struct {
	// TLS verifies https:// servers and may hold a client certificate;
	// nil means the system's roots, TLS 1.2 or later.
	TLS *tls.Config
	// Proxy, when set, carries every request, and its host is the one
	// connected to and checked. Nil connects directly: the environment's
	// HTTP_PROXY and HTTPS_PROXY are never read, since a proxy would see
	// what is sent.
	Proxy *url.URL
}

// maxRedirects is how many same-origin redirects a client follows.
const maxRedirects = 5

// HTTPClient returns the client target (e.g. reference_set:loinc) makes
// its requests with: every connection dialled through p, a proxy only
// when o names one, and redirects followed only to the same scheme and
// host. It keeps no idle connection: these clients are built for one
// sync or one notification. Bound each request with its context.
func (p *Policy) HTTPClient(target string, o HTTPOptions) *http.Client {
	tc := o.TLS
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr := &http.Transport{
		DialContext:         p.Dialer(target),
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableKeepAlives:   true,
	}
	if o.Proxy != nil {
		tr.Proxy = http.ProxyURL(o.Proxy)
	}
	return &http.Client{Transport: tr, CheckRedirect: sameOrigin}
}

// RedirectError is a redirect a client refused to follow.
type RedirectError struct {
	// From and To are the URLs without user information or query, which
	// may carry credentials.
	From, To string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("refused a redirect from %s to %s: mefor follows a redirect only to the same scheme and host; set the url to the final address",
		e.From, e.To)
}

// sameOrigin lets a redirect through only to the scheme and host (and
// port) of the first request: one from https to http would send the rest
// in the clear, one to another host would send it where nobody listed.
func sameOrigin(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return &RedirectError{From: shown(via[len(via)-1].URL), To: shown(req.URL)}
	}
	if len(via) > maxRedirects {
		return errors.New("stopped after " + fmt.Sprint(maxRedirects) + " redirects")
	}
	return nil
}

func shown(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
