package config

import (
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Alerts configures mefor's own alerting, for teams without Prometheus: rules
// over the queues that River's elected leader evaluates every Interval, and
// the sinks a rule notifies when it starts and stops breaching.
type Alerts struct {
	// Interval is how often the rules are evaluated. Defaults to 30s.
	Interval time.Duration
	// Sinks are where notifications go, in file order.
	Sinks []AlertSink
	// Rules are evaluated in file order.
	Rules []AlertRule
}

// AlertSink is one place notifications go. Exactly one of Webhook, Email,
// Syslog and Log is set.
type AlertSink struct {
	Name    string
	Webhook *WebhookSink
	Email   *EmailSink
	Syslog  *SyslogSink
	Log     *LogSink
}

// Alert sink kinds, as the config spells them.
const (
	SinkWebhook = "webhook"
	SinkEmail   = "email"
	SinkSyslog  = "syslog"
	SinkLog     = "log"
)

// Kind names the kind of the sink: webhook, email, syslog or log; empty
// when none or several are set (config refuses such a file).
func (s *AlertSink) Kind() string {
	kinds := s.kinds()
	if len(kinds) != 1 {
		return ""
	}
	return kinds[0]
}

func (s *AlertSink) kinds() []string {
	var out []string
	for _, k := range []struct {
		name string
		set  bool
	}{{SinkWebhook, s.Webhook != nil}, {SinkEmail, s.Email != nil}, {SinkSyslog, s.Syslog != nil}, {SinkLog, s.Log != nil}} {
		if k.set {
			out = append(out, k.name)
		}
	}
	return out
}

// WebhookSink POSTs each notification as JSON.
type WebhookSink struct {
	URL string
	// Headers are sent with every POST, in file order. Values usually hold
	// credentials (write them as ${VAR}); they are never logged or shown.
	Headers []Header
	// Timeout bounds one POST. Defaults to 10s.
	Timeout time.Duration
	// TLS configures an https:// URL: the CAs the receiver must chain to
	// (the system's roots without it), a client certificate. The same
	// block as a destination's.
	TLS ClientTLS
	// Proxy is the URL of the HTTP proxy POSTs go through; empty connects
	// directly. The environment's proxy variables are never used.
	Proxy string
	// Plaintext acknowledges an http:// URL to another machine, which is
	// otherwise flagged by `mefor config check` and `mefor status`.
	Plaintext bool
}

// Header is one HTTP header of a webhook.
type Header struct {
	Name, Value string
}

// LogSink writes each notification as a structured line of the node's log.
type LogSink struct {
	// Level is the level of the lines: warn, error or info. Defaults to
	// warn.
	Level string
}

// AlertRule watches one destination's or one channel's queue. It breaches
// when any of its conditions holds, and clears when none does.
type AlertRule struct {
	Name string
	// Destination or Channel names what the rule watches; exactly one is
	// set. A destination's queue is its pending deliveries; a channel's is
	// its work not yet handed to a destination (ingress and routed rows).
	Destination string
	Channel     string
	// AuditForward, set instead, watches an audit.forward target (syslog
	// or webhook): its queue is the audit rows its receiver has not yet
	// accepted. Only oldest_queued and queue_depth apply.
	AuditForward string
	// OldestQueued breaches when the oldest queued row is at least this old.
	OldestQueued time.Duration
	// QueueDepth breaches when at least this many rows are queued.
	QueueDepth int64
	// DeadLetters breaches when at least this many rows are dead-lettered
	// (and not yet replayed or cancelled).
	DeadLetters int64
	// Tampered breaches when at least this many rows are dead-lettered as
	// tampered (a stored value that did not open as sealed for its row; not
	// yet replayed or cancelled).
	Tampered int64
	// NoTraffic breaches when nothing arrived for this long: no message
	// received on the channel, or none queued for the destination.
	NoTraffic time.Duration
	// Sinks are the names of the sinks notified.
	Sinks []string
}

// Alert condition names, as the config and the notifications spell them.
const (
	ConditionOldestQueued = "oldest_queued"
	ConditionQueueDepth   = "queue_depth"
	ConditionDeadLetters  = "dead_letters"
	ConditionNoTraffic    = "no_traffic"
	ConditionTampered     = "tampered"
)

// Sink returns the sink with the given name, or nil.
func (a *Alerts) Sink(name string) *AlertSink {
	if a == nil {
		return nil
	}
	return find(a.Sinks, func(s *AlertSink) bool { return s.Name == name })
}

const (
	defaultAlertInterval  = 30 * time.Second
	defaultWebhookTimeout = 10 * time.Second
)

var logLevels = []string{"info", "warn", "error"}

func (l *loader) decodeAlerts(n *yaml.Node, p path) *Alerts {
	a := &Alerts{Interval: defaultAlertInterval}
	m := l.mapping(n, p, "interval", "sinks", "rules")
	decodeScalar(l, m, p, "interval", &a.Interval, parseDuration)

	sp := p.key("sinks")
	if sn := m["sinks"]; !isNull(sn) {
		if sn.Kind != yaml.MappingNode {
			l.errorAt(sn, sp, "must map sink names to their settings, e.g. sinks: {ops: {webhook: {url: https://hooks.example.org/mefor}}}")
			l.bad[sp] = true
		} else {
			l.eachName(sn, sp, sp.key, "sink names", func(name string, n *yaml.Node, np path) {
				a.Sinks = append(a.Sinks, l.decodeAlertSink(name, n, np))
			})
		}
	}
	for i, rn := range l.sequence(m["rules"], p.key("rules")) {
		a.Rules = append(a.Rules, l.decodeAlertRule(rn, p.key("rules").index(i)))
	}
	return a
}

func (l *loader) decodeAlertSink(name string, n *yaml.Node, p path) AlertSink {
	s := AlertSink{Name: name}
	m := l.mapping(n, p, SinkWebhook, SinkEmail, SinkSyslog, SinkLog)
	if wn, ok := m[SinkWebhook]; ok {
		s.Webhook = l.decodeWebhook(wn, p.key(SinkWebhook))
	}
	if en, ok := m[SinkEmail]; ok {
		s.Email = l.decodeEmailSink(en, p.key(SinkEmail))
	}
	if sn, ok := m[SinkSyslog]; ok {
		s.Syslog = l.decodeSyslogSink(sn, p.key(SinkSyslog))
	}
	if ln, ok := m["log"]; ok {
		lp := p.key("log")
		s.Log = &LogSink{Level: "warn"}
		lm := l.mapping(ln, lp, "level")
		decodeScalar(l, lm, lp, "level", &s.Log.Level, asString)
	}
	return s
}

// decodeWebhook reads a webhook: block (an alert sink's, audit.forward's).
func (l *loader) decodeWebhook(wn *yaml.Node, wp path) *WebhookSink {
	w := &WebhookSink{Timeout: defaultWebhookTimeout}
	wm := l.mapping(wn, wp, "url", "headers", "timeout", "tls", "proxy", "plaintext")
	decodeScalar(l, wm, wp, "url", &w.URL, asString)
	decodeScalar(l, wm, wp, "timeout", &w.Timeout, parseDuration)
	decodeScalar(l, wm, wp, "proxy", &w.Proxy, asString)
	decodeScalar(l, wm, wp, "plaintext", &w.Plaintext, parseBool)
	if tn, ok := wm["tls"]; ok {
		w.TLS = l.decodeClientTLS(tn, wp.key("tls"))
	}
	hp := wp.key("headers")
	if hn := wm["headers"]; !isNull(hn) {
		if hn.Kind != yaml.MappingNode {
			l.errorAt(hn, hp, "must map header names to values, e.g. headers: {Authorization: \"${HOOK_TOKEN}\"}")
			l.bad[hp] = true
		} else {
			for _, e := range l.entries(hn, hp) {
				kp := hp.key(e.key.Value)
				l.record(kp, e.key)
				// text expands ${VAR}; its errors name the variable,
				// never the value.
				if v, ok := l.text(resolve(e.value), kp); ok {
					w.Headers = append(w.Headers, Header{Name: e.key.Value, Value: v})
				}
			}
		}
	}
	return w
}

func (l *loader) decodeAlertRule(n *yaml.Node, p path) AlertRule {
	var r AlertRule
	m := l.mapping(n, p, "name", "destination", "channel", "audit_forward",
		ConditionOldestQueued, ConditionQueueDepth, ConditionDeadLetters, ConditionNoTraffic, ConditionTampered, "sinks")
	decodeScalar(l, m, p, "name", &r.Name, asString)
	decodeScalar(l, m, p, "destination", &r.Destination, asString)
	decodeScalar(l, m, p, "channel", &r.Channel, asString)
	decodeScalar(l, m, p, "audit_forward", &r.AuditForward, asString)
	decodeScalar(l, m, p, ConditionOldestQueued, &r.OldestQueued, parseDuration)
	decodeScalar(l, m, p, ConditionQueueDepth, &r.QueueDepth, parseInt64)
	decodeScalar(l, m, p, ConditionDeadLetters, &r.DeadLetters, parseInt64)
	decodeScalar(l, m, p, ConditionNoTraffic, &r.NoTraffic, parseDuration)
	decodeScalar(l, m, p, ConditionTampered, &r.Tampered, parseInt64)
	l.strings(m, p, "sinks", &r.Sinks)
	return r
}

func parseInt64(s string) (int64, error) {
	n, err := parseInt(s)
	return int64(n), err
}

func (l *loader) checkAlerts(c *Config) {
	a := c.Alerts
	if a == nil {
		return
	}
	p := path{section: "alerts"}
	if ip := p.key("interval"); !l.failed(ip) && a.Interval < time.Second {
		l.errorf(ip, "must be at least 1s (e.g. interval: %s): each evaluation reads the queues", fmtDuration(defaultAlertInterval))
	}
	var sinkNames []string
	used := map[string]bool{}
	for i := range a.Sinks {
		s := &a.Sinks[i]
		sinkNames = append(sinkNames, s.Name)
		l.checkAlertSink(s, p.key("sinks").key(s.Name))
	}
	var dests, chans []string
	for _, d := range c.Destinations {
		dests = append(dests, d.Name)
	}
	for _, ch := range c.Channels {
		chans = append(chans, ch.Name)
	}
	names := map[string]int{}
	for i := range a.Rules {
		r := &a.Rules[i]
		rp := p.key("rules").index(i)
		np := rp.key("name")
		switch {
		case l.failed(np):
		case !l.given(np):
			l.errorf(np, "is required: what notifications and 'mefor alerts list' call the rule (e.g. name: lab-backlog)")
		case !namePattern.MatchString(r.Name):
			l.errorf(np, "%s", badName(r.Name))
		default:
			if j, dup := names[r.Name]; dup {
				l.errorf(np, "%q is already the name of rules[%d]; rule names must be unique", r.Name, j)
			}
			names[r.Name] = i
		}

		dp, cp, fp := rp.key("destination"), rp.key("channel"), rp.key("audit_forward")
		switch {
		case l.given(fp) && (l.given(dp) || l.given(cp)):
			l.errorf(fp, "and %s are both set; a rule watches one queue: keep one of them", map[bool]string{true: "destination", false: "channel"}[l.given(dp)])
		case l.given(fp):
			if !l.failed(fp) {
				l.checkAuditForwardRule(c, r, rp)
			}
		case l.given(dp) && l.given(cp):
			l.errorf(cp, "and destination are both set; a rule watches one queue: keep one of them")
		case l.given(dp):
			if c.Destination(r.Destination) == nil && !l.failed(dp) {
				l.errorf(dp, "%q is not a destination of this config%s", r.Destination, didYouMean(r.Destination, dests, "%q"))
			}
		case l.given(cp):
			if c.Channel(r.Channel) == nil && !l.failed(cp) {
				l.errorf(cp, "%q is not a channel of this config%s", r.Channel, didYouMean(r.Channel, chans, "%q"))
			}
		default:
			l.errorf(dp, "is required (or channel:): the queue the rule watches, e.g. destination: %s", firstOr(dests, "lab"))
		}

		conds := 0
		for _, k := range []string{ConditionOldestQueued, ConditionQueueDepth, ConditionDeadLetters, ConditionNoTraffic, ConditionTampered} {
			kp := rp.key(k)
			if !l.given(kp) {
				continue
			}
			conds++
			if l.failed(kp) {
				continue
			}
			switch k {
			case ConditionOldestQueued:
				l.positive(rp, k, r.OldestQueued, 10*time.Minute)
			case ConditionNoTraffic:
				l.positive(rp, k, r.NoTraffic, 30*time.Minute)
			case ConditionQueueDepth:
				if r.QueueDepth < 1 {
					l.errorf(kp, "must be at least 1 (e.g. queue_depth: 500): the rule fires when this many rows are queued")
				}
			case ConditionDeadLetters:
				if r.DeadLetters < 1 {
					l.errorf(kp, "must be at least 1 (e.g. dead_letters: 1): the rule fires when this many rows are dead-lettered")
				}
			case ConditionTampered:
				if r.Tampered < 1 {
					l.errorf(kp, "must be at least 1 (e.g. tampered: 1): the rule fires when this many rows are dead-lettered as tampered")
				}
			}
		}
		if conds == 0 {
			l.errorf(rp, "has no condition; give at least one of oldest_queued: 10m, queue_depth: 500, dead_letters: 1, no_traffic: 30m, tampered: 1")
		}

		sp := rp.key("sinks")
		switch {
		case l.failed(sp):
		case len(r.Sinks) == 0:
			l.errorf(sp, "is required: the sinks to notify, e.g. sinks: [%s]", firstOr(sinkNames, "ops"))
		}
		for j, s := range r.Sinks {
			used[s] = true
			if a.Sink(s) == nil {
				if len(sinkNames) == 0 {
					l.errorf(sp.index(j), "%q is not defined; declare it under alerts.sinks, e.g. %s: {log: {}}", s, s)
				} else {
					l.errorf(sp.index(j), "%q is not a sink (declare it under alerts.sinks)%s", s, didYouMean(s, sinkNames, "%q"))
				}
			} else if slices.Index(r.Sinks, s) < j {
				l.errorf(sp.index(j), "%q is listed twice", s)
			}
		}
	}
	for _, s := range a.Sinks {
		if !used[s.Name] {
			l.warnf(p.key("sinks").key(s.Name), "is not used by any rule")
		}
	}
}

// checkAuditForwardRule checks a rule watching an audit.forward target.
func (l *loader) checkAuditForwardRule(c *Config, r *AlertRule, rp path) {
	fp := rp.key("audit_forward")
	var targets []string
	if f := c.Audit.Forward; f != nil {
		if f.Syslog != nil {
			targets = append(targets, "syslog")
		}
		if f.Webhook != nil {
			targets = append(targets, "webhook")
		}
	}
	switch {
	case len(targets) == 0:
		l.errorf(fp, "%q is not forwarded to: the config has no audit.forward target; add audit.forward.%s, or remove the rule", r.AuditForward, r.AuditForward)
	case !slices.Contains(targets, r.AuditForward):
		l.errorf(fp, "%q is not an audit.forward target of this config; use one of %s", r.AuditForward, strings.Join(targets, ", "))
	}
	for _, k := range []string{ConditionDeadLetters, ConditionNoTraffic, ConditionTampered} {
		if l.given(rp.key(k)) {
			l.errorf(rp.key(k), "does not apply to an audit_forward rule; use oldest_queued (the oldest row not yet accepted) or queue_depth (rows not yet accepted)")
		}
	}
}

func (l *loader) checkAlertSink(s *AlertSink, p path) {
	switch kinds := s.kinds(); {
	case len(kinds) > 1:
		l.errorf(p, "has both %s and %s; a sink is one of them, declare two sinks to use both", kinds[0], kinds[1])
		return
	case len(kinds) == 0:
		if !l.failed(p) {
			l.errorf(p, "needs one of %s", alertSinkKindsForAnExample)
		}
		return
	}
	if w := s.Webhook; w != nil {
		l.checkWebhook(w, p.key(SinkWebhook), "notifications")
	}
	if e := s.Email; e != nil {
		l.checkEmailSink(e, p.key(SinkEmail))
	}
	if sl := s.Syslog; sl != nil {
		l.checkSyslogSink(sl, p.key(SinkSyslog))
	}
	if lg := s.Log; lg != nil {
		if lp := p.key("log").key("level"); !l.failed(lp) && !slices.Contains(logLevels, lg.Level) {
			l.errorf(lp, "%q is not a level; use one of %s", lg.Level, strings.Join(logLevels, ", "))
		}
	}
}

// checkWebhook checks a webhook: block at wp; what names what it POSTs.
func (l *loader) checkWebhook(w *WebhookSink, wp path, what string) {
	up := wp.key("url")
	if !l.given(up) {
		l.errorf(up, "is required: where to POST %s, e.g. url: https://hooks.example.org/mefor", what)
	} else if u, err := url.Parse(w.URL); !l.failed(up) && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		// The value is not quoted: a query string may hold a token.
		l.errorf(up, "must be an http:// or https:// URL with a host (e.g. url: https://hooks.example.org/mefor)")
	} else if !l.failed(up) {
		l.checkHTTPClient(wp, u, &w.TLS, w.Proxy, w.Plaintext)
	}
	l.positive(wp, "timeout", w.Timeout, defaultWebhookTimeout)
	for _, h := range w.Headers {
		if strings.TrimSpace(h.Name) == "" || strings.ContainsAny(h.Name, " :\r\n") {
			l.errorf(wp.key("headers").key(h.Name), "is not a valid HTTP header name")
		}
		if strings.ContainsAny(h.Value, "\r\n") {
			l.errorf(wp.key("headers").key(h.Name), "has a line break in its value; a header value is one line")
		}
	}
}

func firstOr(names []string, def string) string {
	if len(names) > 0 {
		return names[0]
	}
	return def
}
