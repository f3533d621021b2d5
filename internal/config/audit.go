package config

import (
	"crypto/tls"
	"net"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Audit configures the audit log beyond the database.
type Audit struct {
	// Forward sends the audit trail off the box; nil when the file has no
	// audit.forward block.
	Forward *AuditForward
}

// AuditForward sends every audit row, and every anchor, to a syslog
// receiver and/or a webhook, at least once and in order, from a cursor per
// target kept in the database. River's elected leader enqueues the
// audit-forward job every Interval; one node works it at a time.
type AuditForward struct {
	// Interval is how often the job runs. Defaults to 10s.
	Interval time.Duration
	// BatchSize is how many rows one send carries at most. Defaults to 500.
	BatchSize int
	// RetryMin and RetryMax bound the backoff between attempts at a batch
	// the receiver did not accept. Default to 1s and 1m.
	RetryMin, RetryMax time.Duration
	// Syslog and Webhook are the targets; at least one is set.
	Syslog  *AuditSyslog
	Webhook *WebhookSink
}

// AuditSyslog is a syslog receiver reached over TCP with TLS (RFC 5425):
// RFC 5424 messages, octet-counted.
type AuditSyslog struct {
	// Address is the receiver's host:port (6514 is syslog over TLS's port).
	Address string
	// TLS verifies the receiver (ca_file; the system's roots without it),
	// names it (server_name, defaulting to the address's host) and may
	// present a client certificate (cert_file, key_file). TLS is always
	// on: there is no plaintext syslog target.
	TLS ClientTLS
	// AppName is the messages' APP-NAME. Defaults to mefor.
	AppName string
	// Facility is the messages' facility number, 0 to 23. Defaults to 13
	// (log audit).
	Facility int
	// Timeout bounds one batch: connecting, writing and the receiver's
	// confirmation. Defaults to 10s.
	Timeout time.Duration
	// Confirm waits, after each batch, for the receiver to close its side
	// of the TLS stream in answer to mefor's close_notify, which says it
	// read the whole batch. Defaults to true; set false for a receiver
	// that keeps the connection open (the batch then counts once written).
	Confirm bool
}

const (
	defaultAuditForwardInterval = 10 * time.Second
	defaultAuditForwardBatch    = 500
	maxAuditForwardBatch        = 10_000
	defaultAuditRetryMin        = time.Second
	defaultAuditRetryMax        = time.Minute
	defaultSyslogTimeout        = 10 * time.Second
	defaultSyslogFacility       = 13
)

func (l *loader) decodeAudit(n *yaml.Node, p path) Audit {
	var a Audit
	m := l.mapping(n, p, "forward")
	fn, ok := m["forward"]
	if !ok {
		return a
	}
	fp := p.key("forward")
	f := &AuditForward{Interval: defaultAuditForwardInterval, BatchSize: defaultAuditForwardBatch,
		RetryMin: defaultAuditRetryMin, RetryMax: defaultAuditRetryMax}
	fm := l.mapping(fn, fp, "interval", "batch_size", "retry_min", "retry_max", "syslog", "webhook")
	decodeScalar(l, fm, fp, "interval", &f.Interval, parseDuration)
	decodeScalar(l, fm, fp, "batch_size", &f.BatchSize, parseInt)
	decodeScalar(l, fm, fp, "retry_min", &f.RetryMin, parseDuration)
	decodeScalar(l, fm, fp, "retry_max", &f.RetryMax, parseDuration)
	if sn, ok := fm["syslog"]; ok {
		sp := fp.key("syslog")
		s := &AuditSyslog{AppName: "mefor", Facility: defaultSyslogFacility, Timeout: defaultSyslogTimeout, Confirm: true,
			TLS: ClientTLS{Enabled: true, MinVersion: tls.VersionTLS12}}
		sm := l.mapping(sn, sp, "address", "tls", "app_name", "facility", "timeout", "confirm")
		decodeScalar(l, sm, sp, "address", &s.Address, asString)
		decodeScalar(l, sm, sp, "app_name", &s.AppName, asString)
		decodeScalar(l, sm, sp, "facility", &s.Facility, parseInt)
		decodeScalar(l, sm, sp, "timeout", &s.Timeout, parseDuration)
		decodeScalar(l, sm, sp, "confirm", &s.Confirm, parseBool)
		if tn, ok := sm["tls"]; ok {
			s.TLS = l.decodeClientTLS(tn, sp.key("tls"))
		}
		f.Syslog = s
	}
	if wn, ok := fm["webhook"]; ok {
		f.Webhook = l.decodeWebhook(wn, fp.key("webhook"))
	}
	a.Forward = f
	return a
}

func (l *loader) checkAudit(c *Config) {
	f := c.Audit.Forward
	if f == nil {
		return
	}
	p := path{section: "audit"}.key("forward")
	if f.Syslog == nil && f.Webhook == nil && !l.failed(p) {
		l.errorf(p, "has no target; give syslog: {address: siem.example.org:6514} and/or webhook: {url: https://siem.example.org/mefor}")
	}
	if ip := p.key("interval"); !l.failed(ip) && f.Interval < time.Second {
		l.errorf(ip, "must be at least 1s (e.g. interval: %s): each run reads the audit log", fmtDuration(defaultAuditForwardInterval))
	}
	if bp := p.key("batch_size"); !l.failed(bp) && (f.BatchSize < 1 || f.BatchSize > maxAuditForwardBatch) {
		l.errorf(bp, "must be from 1 to %d (e.g. batch_size: %d): how many audit rows one send carries", maxAuditForwardBatch, defaultAuditForwardBatch)
	}
	lo, hi := p.key("retry_min"), p.key("retry_max")
	okLo := l.failed(lo) || l.positive(p, "retry_min", f.RetryMin, defaultAuditRetryMin)
	okHi := l.failed(hi) || l.positive(p, "retry_max", f.RetryMax, defaultAuditRetryMax)
	if okLo && okHi && !l.failed(lo) && !l.failed(hi) && f.RetryMax < f.RetryMin {
		l.errorf(l.preferGiven(hi, lo), "breaks retry_min <= retry_max (got retry_min %s, retry_max %s)", l.show(lo, f.RetryMin), l.show(hi, f.RetryMax))
	}
	if s := f.Syslog; s != nil {
		sp := p.key("syslog")
		ap := sp.key("address")
		host, port, err := net.SplitHostPort(s.Address)
		n, perr := strconv.Atoi(port)
		switch {
		case l.failed(ap):
		case !l.given(ap):
			l.errorf(ap, "is required: the syslog receiver's host:port, e.g. address: siem.example.org:6514")
		case err != nil || perr != nil || host == "" || n < 1 || n > 65535:
			l.errorf(ap, "must be host:port with a port from 1 to 65535, e.g. address: siem.example.org:6514")
		}
		l.checkClientTLS(&s.TLS, host, sp)
		if fp := sp.key("facility"); !l.failed(fp) && (s.Facility < 0 || s.Facility > 23) {
			l.errorf(fp, "must be a syslog facility number from 0 to 23 (e.g. facility: 13, log audit; 10 is authpriv)")
		}
		if ap := sp.key("app_name"); !l.failed(ap) && (s.AppName == "" || len(s.AppName) > 48 || !printableNoSpace(s.AppName)) {
			l.errorf(ap, "must be 1 to 48 printable characters without spaces (RFC 5424 APP-NAME), e.g. app_name: mefor")
		}
		l.positive(sp, "timeout", s.Timeout, defaultSyslogTimeout)
	}
	if w := f.Webhook; w != nil {
		l.checkWebhook(w, p.key("webhook"), "the audit rows")
	}
}

func printableNoSpace(s string) bool {
	for _, r := range s {
		if r < 33 || r > 126 {
			return false
		}
	}
	return true
}
