package config

import (
	"crypto/tls"
	"net"
	"net/mail"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/egress"
)

// EmailSink mails each notification over SMTP: one mail to every
// recipient, its subject naming the rule and its state.
type EmailSink struct {
	// Address is the SMTP server's host:port (587 is mail submission).
	Address string
	// From is the envelope sender and the From: header.
	From string
	// To are the recipients; each gets the mail.
	To []string
	// StartTLS upgrades the connection with STARTTLS before anything else
	// is sent, and fails the attempt when the server does not offer it.
	// Defaults to true.
	StartTLS bool
	// TLS verifies the server during STARTTLS: ca_file (the system's roots
	// without it), server_name (defaulting to the address's host), and a
	// client certificate the server may ask for. The same block as a
	// destination's.
	TLS ClientTLS
	// Username, when set, authenticates with SMTP AUTH PLAIN, with
	// Password. Write the password as ${VAR}: it is read from the
	// environment when the config is loaded, and never logged or shown.
	Username, Password string
	// Timeout bounds one mail: connecting, the dialogue and the server's
	// acceptance. Defaults to 10s.
	Timeout time.Duration
	// Plaintext acknowledges starttls: false to a server on another
	// machine, which is otherwise refused: the mail, and the password,
	// would cross the network unencrypted.
	Plaintext bool
}

// SyslogSink sends each notification as one RFC 5424 message over TCP,
// octet-counted (RFC 6587), one connection per notification.
type SyslogSink struct {
	// Address is the receiver's host:port.
	Address string
	// TLS, when given, speaks TLS to the receiver (RFC 5425): the same
	// block as audit.forward's syslog target (ca_file, server_name,
	// cert_file, key_file). Without it the messages go in plaintext TCP,
	// allowed to loopback or with Plaintext.
	TLS ClientTLS
	// Facility is the messages' facility number, 0 to 23. Defaults to 1
	// (user).
	Facility int
	// AppName is the messages' APP-NAME. Defaults to mefor.
	AppName string
	// Timeout bounds one notification: connecting, writing and the
	// receiver's confirmation. Defaults to 10s.
	Timeout time.Duration
	// Confirm waits for the receiver to close its side in answer to
	// mefor's, which says it read the message. Defaults to true; set false
	// for a receiver that keeps the connection open.
	Confirm bool
	// Plaintext acknowledges a receiver on another machine without tls:,
	// which is otherwise refused.
	Plaintext bool
}

const (
	defaultEmailTimeout        = 10 * time.Second
	defaultAlertSyslogFacility = 1
	defaultAlertSyslogAppName  = "mefor"
	defaultAlertSyslogTimeout  = 10 * time.Second
	exampleEmailAddress        = "smtp.example.org:587"
	exampleAlertSyslogAddress  = "syslog.example.org:6514"
	literalPasswordWarningHint = "write it as ${VAR} (e.g. password: \"${SMTP_PASSWORD}\") so that the file holds no secret"
	alertSinkKindsForAnExample = "webhook: {url: https://...}, email: {address: smtp.example.org:587, from: ..., to: [...]}, syslog: {address: ...} or log: {}"
)

func (l *loader) decodeEmailSink(n *yaml.Node, p path) *EmailSink {
	e := &EmailSink{StartTLS: true, Timeout: defaultEmailTimeout, TLS: ClientTLS{Enabled: true, MinVersion: tls.VersionTLS12}}
	m := l.mapping(n, p, "address", "from", "to", "starttls", "tls", "username", "password", "timeout", "plaintext")
	decodeScalar(l, m, p, "address", &e.Address, asString)
	decodeScalar(l, m, p, "from", &e.From, asString)
	l.strings(m, p, "to", &e.To)
	decodeScalar(l, m, p, "starttls", &e.StartTLS, parseBool)
	decodeScalar(l, m, p, "username", &e.Username, asString)
	// The password expands ${VAR} like every value; errors name the
	// variable, never the value.
	decodeScalar(l, m, p, "password", &e.Password, asString)
	if pn, ok := m["password"]; ok && pn.Kind == yaml.ScalarNode && !isNull(pn) && !strings.Contains(pn.Value, "${") {
		l.warnf(p.key("password"), "is written in the file; %s", literalPasswordWarningHint)
	}
	decodeScalar(l, m, p, "timeout", &e.Timeout, parseDuration)
	decodeScalar(l, m, p, "plaintext", &e.Plaintext, parseBool)
	if tn, ok := m["tls"]; ok {
		e.TLS = l.decodeClientTLS(tn, p.key("tls"))
	}
	if !e.StartTLS && !l.given(p.key("tls")) {
		e.TLS = ClientTLS{}
	}
	return e
}

func (l *loader) decodeSyslogSink(n *yaml.Node, p path) *SyslogSink {
	s := &SyslogSink{Facility: defaultAlertSyslogFacility, AppName: defaultAlertSyslogAppName, Timeout: defaultAlertSyslogTimeout, Confirm: true}
	m := l.mapping(n, p, "address", "tls", "facility", "app_name", "timeout", "confirm", "plaintext")
	decodeScalar(l, m, p, "address", &s.Address, asString)
	decodeScalar(l, m, p, "facility", &s.Facility, parseInt)
	decodeScalar(l, m, p, "app_name", &s.AppName, asString)
	decodeScalar(l, m, p, "timeout", &s.Timeout, parseDuration)
	decodeScalar(l, m, p, "confirm", &s.Confirm, parseBool)
	decodeScalar(l, m, p, "plaintext", &s.Plaintext, parseBool)
	if tn, ok := m["tls"]; ok {
		s.TLS = l.decodeClientTLS(tn, p.key("tls"))
	}
	return s
}

// checkHostPort checks a host:port at ap and returns its host and port;
// ok is false when it is missing or invalid (reported).
func (l *loader) checkHostPort(ap path, v, example, what string) (host string, port int, ok bool) {
	if l.failed(ap) {
		return "", 0, false
	}
	if !l.given(ap) {
		l.errorf(ap, "is required: %s, e.g. address: %s", what, example)
		return "", 0, false
	}
	host, ps, err := net.SplitHostPort(v)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || host == "" || port < 1 || port > 65535 {
		l.errorf(ap, "must be host:port with a port from 1 to 65535, e.g. address: %s", example)
		return "", 0, false
	}
	return host, port, true
}

func (l *loader) checkEmailSink(e *EmailSink, p path) {
	host, _, hostOK := l.checkHostPort(p.key("address"), e.Address, exampleEmailAddress, "the SMTP server's host:port")
	fp := p.key("from")
	switch {
	case l.failed(fp):
	case !l.given(fp):
		l.errorf(fp, "is required: the address the mail comes from, e.g. from: mefor@example.org")
	default:
		if _, err := mail.ParseAddress(e.From); err != nil || strings.ContainsAny(e.From, "\r\n") {
			l.errorf(fp, "%q is not a mail address (e.g. from: mefor@example.org)", e.From)
		}
	}
	tp := p.key("to")
	switch {
	case l.failed(tp):
	case len(e.To) == 0:
		l.errorf(tp, "is required: who gets the mail, e.g. to: [oncall@example.org]")
	}
	for i, to := range e.To {
		if _, err := mail.ParseAddress(to); err != nil || strings.ContainsAny(to, "\r\n") {
			l.errorf(tp.index(i), "%q is not a mail address (e.g. oncall@example.org)", to)
		}
	}
	if l.given(p.key("password")) && !l.given(p.key("username")) {
		l.errorf(p.key("username"), "is required with password: the account the password is for")
	}
	if l.given(p.key("username")) && !l.given(p.key("password")) {
		l.errorf(p.key("password"), "is required with username, e.g. password: \"${SMTP_PASSWORD}\"")
	}
	l.positive(p, "timeout", e.Timeout, defaultEmailTimeout)
	sp, pp := p.key("starttls"), p.key("plaintext")
	switch {
	case e.StartTLS:
		if e.Plaintext && !l.failed(pp) {
			l.errorf(pp, "is true but starttls is on; remove plaintext: true (it acknowledges starttls: false)")
		}
		l.checkClientTLS(&e.TLS, host, p)
	case l.given(p.key("tls")):
		l.errorf(p.key("tls"), "is set but starttls is false; remove the tls: block, or starttls: false to encrypt with STARTTLS")
	case hostOK && !e.Plaintext && !egress.IsLoopback(host) && !l.failed(sp):
		l.errorf(sp, "is false for %s, another machine: the mail%s would cross the network unencrypted; "+
			"remove starttls: false (STARTTLS is the default), or set plaintext: true beside it to acknowledge a trusted network",
			e.Address, map[bool]string{true: " and the password", false: ""}[e.Username != ""])
	}
}

func (l *loader) checkSyslogSink(s *SyslogSink, p path) {
	host, _, hostOK := l.checkHostPort(p.key("address"), s.Address, exampleAlertSyslogAddress, "the syslog receiver's host:port")
	pp := p.key("plaintext")
	switch {
	case s.TLS.Enabled:
		if s.Plaintext && !l.failed(pp) {
			l.errorf(pp, "is true but a tls: block is set too; remove plaintext: true to send over TLS, or the tls: block to send in plaintext")
		}
		l.checkClientTLS(&s.TLS, host, p)
	case hostOK && !s.Plaintext && !egress.IsLoopback(host):
		l.errorf(p.key("address"), "%s is another machine and there is no tls: block: the notifications would cross the network unencrypted; "+
			"add tls: {ca_file: ...} (tls: {} for the system's roots), or set plaintext: true beside address to acknowledge a trusted network", s.Address)
	}
	if fp := p.key("facility"); !l.failed(fp) && (s.Facility < 0 || s.Facility > 23) {
		l.errorf(fp, "must be a syslog facility number from 0 to 23 (e.g. facility: 1, user)")
	}
	if ap := p.key("app_name"); !l.failed(ap) && (s.AppName == "" || len(s.AppName) > 48 || !printableNoSpace(s.AppName)) {
		l.errorf(ap, "must be 1 to 48 printable characters without spaces (RFC 5424 APP-NAME), e.g. app_name: mefor")
	}
	l.positive(p, "timeout", s.Timeout, defaultAlertSyslogTimeout)
}

// hostPortOf splits a valid host:port; ok is false otherwise.
func hostPortOf(v string) (host string, port int, ok bool) {
	host, ps, err := net.SplitHostPort(v)
	port, perr := strconv.Atoi(ps)
	return host, port, err == nil && perr == nil && host != "" && port > 0 && port < 65536
}

// alertSinkOutbound is the connection of an email or syslog sink
// (webhooks are listed with the other HTTP clients); ok is false for
// other sinks and for an address that is invalid (already reported).
func (l *loader) alertSinkOutbound(s *AlertSink) (Outbound, bool) {
	sp := path{section: "alerts"}.key("sinks").key(s.Name)
	var addr, proto string
	var ap path
	switch {
	case s.Email != nil:
		addr, ap, proto = s.Email.Address, sp.key(SinkEmail).key("address"), "smtp-starttls"
		if !s.Email.StartTLS {
			proto = "smtp"
		}
	case s.Syslog != nil:
		addr, ap, proto = s.Syslog.Address, sp.key(SinkSyslog).key("address"), "syslog-tls"
		if !s.Syslog.TLS.Enabled {
			proto = "syslog"
		}
	default:
		return Outbound{}, false
	}
	host, port, ok := hostPortOf(addr)
	if !ok || l.failed(ap) {
		return Outbound{}, false
	}
	return Outbound{Target: "alert_sink:" + s.Name, Host: host, Port: port, Protocol: proto, p: ap}, true
}
