package config

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DestinationHTTP delivers each message in the body of an HTTP request.
const DestinationHTTP DestinationType = "http"

// HTTPDestination sends each message as one HTTP request and reads the
// answer: a 2xx status is a delivery, and its body the partner's reply.
type HTTPDestination struct {
	// URL is where requests go, http:// or https://. It must not carry a
	// user name or password: put credentials in a header, which is never
	// logged, while a URL is shown in errors (without its query).
	URL string
	// Method is POST or PUT. Defaults to POST.
	Method string
	// Headers are sent with every request, in file order. Their values
	// never appear in logs or errors. Content-Type defaults to
	// x-application/hl7-v2+er7.
	Headers []HTTPHeader
	// Timeout bounds one request, from connecting to reading the whole
	// answer. Defaults to 30s.
	Timeout time.Duration
	// TLS configures https:// connections: the CAs the partner must chain
	// to (the system's roots without it), a client certificate. The same
	// block as an MLLP destination's.
	TLS ClientTLS
	// Plaintext acknowledges an http:// URL to another machine, which is
	// otherwise flagged by `mefor config check` and `mefor status`.
	Plaintext bool
}

// HTTPHeader is one header of every request.
type HTTPHeader struct {
	Name, Value string
}

// DefaultHTTPContentType is the Content-Type of a request whose destination
// sets none.
const DefaultHTTPContentType = "x-application/hl7-v2+er7"

const defaultHTTPTimeout = 30 * time.Second

// ClientErrorPolicy is what a 4xx answer other than 429 does to a delivery.
type ClientErrorPolicy string

const (
	// ClientErrorDeadLetter dead-letters the row at the first 4xx: the
	// partner says the request itself is wrong, and sending it again would
	// only hold its lane.
	ClientErrorDeadLetter ClientErrorPolicy = "dead-letter"
	// ClientErrorRetry treats a 4xx like any failed attempt, for partners
	// that answer 4xx for what clears up by itself.
	ClientErrorRetry ClientErrorPolicy = "retry"
)

// refusedHeaders are set by mefor for each request.
var refusedHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection"}

func decodeHTTPDestination(l *loader, n *yaml.Node, p path, d *Destination) {
	d.HTTP = &HTTPDestination{Method: http.MethodPost, Timeout: defaultHTTPTimeout}
	m := l.mapping(n, p, "url", "method", "headers", "timeout", "tls", "plaintext")
	decodeScalar(l, m, p, "url", &d.HTTP.URL, asString)
	decodeScalar(l, m, p, "plaintext", &d.HTTP.Plaintext, parseBool)
	decodeScalar(l, m, p, "method", &d.HTTP.Method, asString)
	decodeScalar(l, m, p, "timeout", &d.HTTP.Timeout, parseDuration)
	if hn, ok := m["headers"]; ok {
		d.HTTP.Headers = l.decodeHeaders(hn, p.key("headers"))
	}
	if tn, ok := m["tls"]; ok {
		d.HTTP.TLS = l.decodeClientTLS(tn, p.key("tls"))
	}
}

// decodeHeaders reads a mapping of header names to values. Problems with a
// value never quote it: it may be a credential.
func (l *loader) decodeHeaders(n *yaml.Node, p path) []HTTPHeader {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errorAt(n, p, "must map header names to values, e.g. headers: {Authorization: \"Bearer ${HIE_TOKEN}\"}")
		l.bad[p] = true
		return nil
	}
	var out []HTTPHeader
	seen := map[string]int{}
	for _, e := range l.entries(n, p) {
		name := e.key.Value
		kp := p.key(name)
		canon := http.CanonicalHeaderKey(name)
		if first, dup := seen[canon]; dup {
			if !e.merged {
				l.errorAt(e.key, kp, "is set twice (first on line %d); header names are case-insensitive", first)
			}
			continue
		}
		seen[canon] = e.key.Line
		l.record(kp, e.key)
		switch {
		case !isToken(name):
			l.errorAt(e.key, kp, "is not a header name: letters, digits and !#$%%&'*+-.^_`|~ only")
			continue
		case slices.Contains(refusedHeaders, canon):
			l.errorAt(e.key, kp, "is set by mefor for each request; remove it")
			continue
		}
		v := resolve(e.value)
		if v.Kind != yaml.ScalarNode || isNull(v) {
			l.errorAt(v, kp, "must be a single value (the header's value)")
			continue
		}
		value, err := expand(v.Value, l.getenv)
		if err != nil {
			// expand's errors name variables, never the value.
			l.errorAt(v, kp, "%v", err)
			continue
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			l.errorAt(v, kp, "has a line break or NUL in its value (after ${...} is expanded), which HTTP does not allow")
			continue
		}
		out = append(out, HTTPHeader{Name: canon, Value: value})
	}
	return out
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
		default:
			return false
		}
	}
	return true
}

func checkHTTPDestination(l *loader, d *Destination, p path) {
	if d.HTTP == nil {
		return
	}
	hp := p.key(string(DestinationHTTP))
	up := hp.key("url")
	host := ""
	switch u, err := url.Parse(d.HTTP.URL); {
	case l.failed(up):
	case !l.given(up):
		l.errorf(up, "is required: where to send the messages (e.g. url: https://hie.example.org/hl7)")
	case err != nil:
		l.errorf(up, "is not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		l.errorf(up, "must start with https:// (or http:// on a trusted network), e.g. url: https://hie.example.org/hl7")
	case u.Host == "":
		l.errorf(up, "has no host, e.g. url: https://hie.example.org/hl7")
	case u.User != nil:
		l.errorf(up, "carries a user name or password, which would show wherever the URL does; "+
			"send credentials in a header instead, e.g. headers: {Authorization: \"Basic ${HIE_AUTH}\"}")
	case u.Fragment != "":
		l.errorf(up, "has a #fragment, which is never sent; remove it")
	default:
		host = u.Hostname()
		if d.HTTP.TLS.Enabled && u.Scheme != "https" {
			l.errorf(hp.key("tls"), "applies to https:// URLs only; change the url to https:// or remove the tls: block")
		}
		if d.HTTP.Plaintext && u.Scheme == "https" && !l.failed(hp.key("plaintext")) {
			l.errorf(hp.key("plaintext"), "is true but the url is https://; remove plaintext: true")
		}
	}
	if mp := hp.key("method"); !l.failed(mp) && d.HTTP.Method != http.MethodPost && d.HTTP.Method != http.MethodPut {
		l.errorf(mp, "%q is not supported; use POST (the default) or PUT", d.HTTP.Method)
	}
	l.positive(hp, "timeout", d.HTTP.Timeout, defaultHTTPTimeout)
	l.checkClientTLS(&d.HTTP.TLS, host, hp)
}

func (l *loader) checkClientErrorPolicy(d *Destination, p path) {
	cp := p.key("on_client_error")
	if l.failed(cp) || !l.given(cp) {
		return
	}
	if d.Type != DestinationHTTP {
		l.errorf(cp, "only applies to type: http (it says what a 4xx answer does); remove it")
		return
	}
	policies := []ClientErrorPolicy{ClientErrorDeadLetter, ClientErrorRetry}
	if !slices.Contains(policies, d.OnClientError) {
		l.errorf(cp, "%q is not an on_client_error policy (one of %s)%s", d.OnClientError, joinStrings(policies),
			didYouMean(string(d.OnClientError), toStrings(policies), "%s"))
	}
}

// ClientTLS returns the destination's TLS settings and the key of its tls:
// block below the destination (e.g. "mllp.tls."), for problems about its
// files; a destination without TLS returns the zero ClientTLS.
func (d *Destination) ClientTLS() (ClientTLS, string) {
	switch {
	case d.MLLP != nil:
		return d.MLLP.TLS, "mllp.tls."
	case d.HTTP != nil:
		return d.HTTP.TLS, "http.tls."
	}
	return ClientTLS{}, ""
}
