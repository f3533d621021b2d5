package config

import (
	"errors"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/egress"
)

// Egress says where mefor may connect. With it, the file is fail-closed:
// every destination, reference-set source, alert sink and proxy must be
// in Allow, or loading fails naming it; and a node checks the address of
// each connection it makes against Allow and the addresses its names had
// when the file was loaded (package egress).
type Egress struct {
	// Allow is the list, in file order: host:port, host, *.domain
	// (optionally with :port), an address or a CIDR.
	Allow egress.List
}

// Outbound is one connection the file asks for to another machine: a
// destination's partner, a reference set's source, an alert webhook, or
// the proxy one of them goes through. A node pins the addresses of their
// host names (egress.NewPolicy), and `mefor status` lists those that go
// in plaintext.
type Outbound struct {
	// Target names what connects, as refusals and
	// mefor_egress_refused_total label it: destination:NAME,
	// reference_set:NAME, alert_sink:NAME, audit_forward:syslog or
	// audit_forward:webhook.
	Target string
	// Host is a name or an address literal; Port is always set.
	Host string
	Port int
	// Protocol is what the connection speaks: mllp, http, https, postgres,
	// syslog, syslog-tls, smtp, smtp-starttls or proxy.
	Protocol string
	// Plaintext is set when the connection carries messages, rows or
	// credentials unencrypted to another machine (not loopback) and the
	// file does not acknowledge it with plaintext: true.
	Plaintext bool

	p path
}

// Address is Host:Port.
func (o Outbound) Address() string { return net.JoinHostPort(o.Host, strconv.Itoa(o.Port)) }

// Outbound lists every connection to another machine the file asks for,
// in file order within destinations, reference sets and alert sinks.
func (c *Config) Outbound() []Outbound { return c.outbound }

// OutboundHosts lists the hosts of Outbound, each once.
func (c *Config) OutboundHosts() []string {
	var hosts []string
	seen := map[string]bool{}
	for _, o := range c.outbound {
		if h := strings.ToLower(o.Host); !seen[h] {
			seen[h] = true
			hosts = append(hosts, o.Host)
		}
	}
	return hosts
}

func (l *loader) decodeEgress(n *yaml.Node, p path) *Egress {
	e := &Egress{Allow: egress.List{}}
	m := l.mapping(n, p, "allow")
	ap := p.key("allow")
	if _, ok := m["allow"]; !ok {
		if !l.failed(p) {
			l.errorf(ap, "is required: the hosts, addresses and networks mefor may connect to, e.g. allow: [lab.example.org:2575, 10.20.0.0/16, \"*.hie.example.org\"]; "+
				"remove the egress: section to let mefor connect wherever its config points")
		}
		l.bad[ap] = true
		return e
	}
	var items []string
	l.strings(m, p, "allow", &items)
	bad := false
	defer func() {
		if bad {
			l.bad[ap] = true // a missing entry would make every check against the list cry wolf
		}
	}()
	for i, s := range items {
		ent, err := egress.ParseEntry(s)
		if err != nil {
			l.errorf(ap.index(i), "%q %v", s, err)
			bad = true
			continue
		}
		if ent.IsPrefix() && ent.Prefix().Bits() == 0 {
			l.warnf(ap.index(i), "%q allows every %s address: the list restricts nothing there; list the networks of the partners instead",
				s, map[bool]string{true: "IPv4", false: "IPv6"}[ent.Prefix().Addr().Is4()])
		}
		e.Allow = append(e.Allow, ent)
	}
	return e
}

// checkHTTPClient checks what the HTTP client of a reference source or a
// webhook (the block at p, reaching u) is given beyond its URL: tls only
// for https://, a usable proxy, plaintext only for http://.
func (l *loader) checkHTTPClient(p path, u *url.URL, t *ClientTLS, proxy string, plaintext bool) {
	if t.Enabled && u.Scheme != "https" {
		l.errorf(p.key("tls"), "applies to https:// URLs only; change the url to https:// or remove the tls: block")
	}
	l.checkClientTLS(t, u.Hostname(), p)
	if plaintext && u.Scheme == "https" && !l.failed(p.key("plaintext")) {
		l.errorf(p.key("plaintext"), "is true but the url is https://; remove plaintext: true")
	}
	if pp := p.key("proxy"); l.given(pp) && !l.failed(pp) {
		if _, _, err := proxyAddress(proxy); err != nil {
			l.errorf(pp, "%v", err)
		}
	}
}

// proxyAddress reads a proxy URL: http:// or https://, a host, an optional
// port (the scheme's by default), user information allowed (the proxy's
// credentials). Errors never quote it.
func proxyAddress(raw string) (host string, port int, err error) {
	u, perr := url.Parse(raw)
	switch {
	case perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		return "", 0, errors.New("must be an http:// or https:// URL naming the proxy's host, e.g. proxy: http://proxy.example.org:3128")
	case u.Path != "" && u.Path != "/" || u.RawQuery != "":
		return "", 0, errors.New("must name only the proxy's scheme, host and port, e.g. proxy: http://proxy.example.org:3128")
	}
	host, port = u.Hostname(), defaultPort(u.Scheme)
	if s := u.Port(); s != "" {
		if port, err = strconv.Atoi(s); err != nil || port < 1 || port > 65535 {
			return "", 0, errors.New("has a port that is not a number from 1 to 65535")
		}
	}
	return host, port, nil
}

func defaultPort(scheme string) int {
	if scheme == "https" {
		return 443
	}
	return 80
}

// urlTarget returns where an http:// or https:// URL connects; ok is
// false for a URL that does not parse (reported elsewhere).
func urlTarget(raw string) (u *url.URL, host string, port int, ok bool) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, "", 0, false
	}
	port = defaultPort(u.Scheme)
	if s := u.Port(); s != "" {
		if port, err = strconv.Atoi(s); err != nil {
			return nil, "", 0, false
		}
	}
	return u, u.Hostname(), port, true
}

// collectOutbound lists the connections c asks for, skipping fields that
// did not decode or are invalid (already reported).
func (l *loader) collectOutbound(c *Config) []Outbound {
	var out []Outbound
	web := func(target string, p path, raw, proxy string, acknowledged bool) {
		up := p.key("url")
		u, host, port, ok := urlTarget(raw)
		if !ok || l.failed(up) {
			return
		}
		out = append(out, Outbound{Target: target, Host: host, Port: port, Protocol: u.Scheme, p: up,
			Plaintext: u.Scheme == "http" && !acknowledged && !egress.IsLoopback(host)})
		pp := p.key("proxy")
		if proxy == "" || l.failed(pp) {
			return
		}
		if host, port, err := proxyAddress(proxy); err == nil {
			out = append(out, Outbound{Target: target, Host: host, Port: port, Protocol: "proxy", p: pp})
		}
	}
	for _, d := range c.Destinations {
		p := path{section: "destinations"}.entity(d.Name)
		target := "destination:" + d.Name
		switch {
		case d.MLLP != nil:
			ap := p.key(string(DestinationMLLP)).key("address")
			host, port, err := net.SplitHostPort(d.MLLP.Address)
			n, perr := strconv.Atoi(port)
			if err != nil || perr != nil || host == "" || l.failed(ap) {
				continue
			}
			out = append(out, Outbound{Target: target, Host: host, Port: n, Protocol: "mllp", p: ap,
				Plaintext: !d.MLLP.TLS.Enabled && !d.MLLP.Plaintext && !egress.IsLoopback(host)})
		case d.HTTP != nil:
			web(target, p.key(string(DestinationHTTP)), d.HTTP.URL, "", d.HTTP.Plaintext)
		}
	}
	for _, s := range c.ReferenceSets {
		p := path{section: "reference_sets"}.entity(s.Name).key("source")
		target := "reference_set:" + s.Name
		switch {
		case s.Source.HTTP != nil:
			web(target, p.key("http"), s.Source.HTTP.URL, s.Source.HTTP.Proxy, s.Source.HTTP.Plaintext)
		case s.Source.SQL != nil:
			up := p.key("sql").key("database_url")
			if l.failed(up) {
				continue
			}
			for _, hp := range sqlHosts(s.Source.SQL.DatabaseURL) {
				// The database TLS rule (dbtls) governs plaintext here.
				out = append(out, Outbound{Target: target, Host: hp.host, Port: hp.port, Protocol: "postgres", p: up})
			}
		}
	}
	if c.Alerts != nil {
		for _, s := range c.Alerts.Sinks {
			if s.Webhook != nil {
				web("alert_sink:"+s.Name, path{section: "alerts"}.key("sinks").key(s.Name).key("webhook"),
					s.Webhook.URL, s.Webhook.Proxy, s.Webhook.Plaintext)
			}
			if o, ok := l.alertSinkOutbound(&s); ok {
				out = append(out, o)
			}
		}
	}
	if f := c.Audit.Forward; f != nil {
		fp := path{section: "audit"}.key("forward")
		if s := f.Syslog; s != nil {
			ap := fp.key("syslog").key("address")
			host, port, err := net.SplitHostPort(s.Address)
			n, perr := strconv.Atoi(port)
			if err == nil && perr == nil && host != "" && !l.failed(ap) {
				// Always TLS: never plaintext.
				out = append(out, Outbound{Target: "audit_forward:syslog", Host: host, Port: n, Protocol: "syslog-tls", p: ap})
			}
		}
		if w := f.Webhook; w != nil {
			web("audit_forward:webhook", fp.key("webhook"), w.URL, w.Proxy, w.Plaintext)
		}
	}
	return append(out, l.ssoOutbound(c)...)
}

type hostPort struct {
	host string
	port int
}

// SQLHosts returns the hosts and ports a PostgreSQL URL connects to, its
// fallbacks included; Unix sockets, which never leave the machine, are
// left out, and so is everything of a URL that does not parse.
func SQLHosts(raw string) (hosts []string) {
	for _, hp := range sqlHosts(raw) {
		hosts = append(hosts, hp.host)
	}
	return hosts
}

func sqlHosts(raw string) []hostPort {
	cfg, err := parseSourceURL(raw)
	if err != nil {
		return nil
	}
	var out []hostPort
	add := func(host string, port uint16) {
		if !strings.HasPrefix(host, "/") {
			out = append(out, hostPort{host, int(port)})
		}
	}
	add(cfg.Host, cfg.Port)
	for _, fb := range cfg.Fallbacks {
		add(fb.Host, fb.Port)
	}
	return out
}

// checkEgress checks every outbound connection against egress.allow and
// flags those in plaintext. It runs last: it needs every section.
func (l *loader) checkEgress(c *Config) {
	c.outbound = l.collectOutbound(c)
	check := c.Egress != nil && !l.failed(path{section: "egress"}.key("allow"))
	for _, o := range c.outbound {
		if check && !c.Egress.Allow.Allows(o.Host, o.Port) {
			l.errorf(o.p, "%s is not in egress.allow, so mefor may not connect to it; %s", o.what(), egressFix(c.Egress.Allow, o))
		}
		if o.Plaintext {
			l.warnf(o.p, "%s", plaintextWarning(o))
		}
	}
}

// what names the connection for a message, without a URL's path or query.
func (o Outbound) what() string {
	if o.Protocol == "proxy" {
		return "the proxy " + o.Address()
	}
	return o.Address()
}

// egressFix says what entries would let o through.
func egressFix(list egress.List, o Outbound) string {
	if egress.IsAddress(o.Host) {
		a, _ := netip.ParseAddr(o.Host)
		bits := 24
		if a.Is6() {
			bits = 64
		}
		cidr, _ := a.Prefix(bits)
		return "add " + strconv.Quote(o.Address()) + " (or a network holding it, e.g. " + strconv.Quote(cidr.String()) +
			") to egress.allow, or correct the address"
	}
	fix := "add " + strconv.Quote(o.Address()) + " (or " + strconv.Quote(o.Host)
	if i := strings.Index(o.Host, "."); i > 0 && strings.Contains(o.Host[i+1:], ".") {
		fix += ", or " + strconv.Quote("*"+o.Host[i:])
	}
	fix += ") to egress.allow, or correct the host"
	for _, e := range list {
		if e.IsPrefix() {
			fix += "; a CIDR allows addresses written as addresses, not names that resolve into it"
			break
		}
	}
	return fix
}

func plaintextWarning(o Outbound) string {
	if o.Protocol == "mllp" {
		return o.Address() + " is reached in plaintext MLLP, on another machine: anyone on the path can read the messages; " +
			"add a tls: block (ca_file, and cert_file and key_file for a partner that asks), or plaintext: true beside address to acknowledge a trusted network"
	}
	return "is an http:// URL to " + o.Address() + ", another machine: what is sent and received, headers included, crosses the network unencrypted; " +
		"use https://, or set plaintext: true beside url to acknowledge a trusted network"
}
