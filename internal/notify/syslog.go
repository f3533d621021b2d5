package notify

import (
	"context"
	"strconv"
	"time"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/syslog"
)

// sendSyslog sends n as one RFC 5424 message: MSGID "alert", structured
// data naming the rule, its state, what it watches and the condition, and
// the summary as MSG. Firing is a warning, resolved a notice, a test info.
func sendSyslog(ctx context.Context, t Transport, sink *config.AlertSink, n *Notification, hostname string) error {
	s := sink.Syslog
	m := syslog.Message{Facility: s.Facility, Severity: syslog.SeverityInfo, Time: n.At, Hostname: hostname,
		AppName: s.AppName, MsgID: "alert", Msg: []byte(n.Summary)}
	switch n.State {
	case alert.AlertFiring:
		m.Severity = syslog.SeverityWarning
	case alert.AlertResolved:
		m.Severity = syslog.SeverityNotice
	}
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	m.Params = append(m.Params, syslog.P("rule", n.Rule), syslog.P("state", n.State))
	for _, p := range []syslog.Param{syslog.P("destination", n.Destination), syslog.P("channel", n.Channel),
		syslog.P("audit_forward", n.AuditForward), syslog.P("condition", n.Condition)} {
		if p.Value != "" {
			m.Params = append(m.Params, p)
		}
	}
	if n.Condition != "" {
		m.Params = append(m.Params, syslog.P("value", strconv.FormatFloat(n.Value, 'f', -1, 64)),
			syslog.P("threshold", strconv.FormatFloat(n.Threshold, 'f', -1, 64)), syslog.P("unit", n.Unit))
	}
	c := &syslog.Client{Address: s.Address, Dial: t.Egress.Dialer(Target(sink.Name)), Timeout: s.Timeout, NoConfirm: !s.Confirm}
	if s.TLS.Enabled {
		c.TLS = tlsFor(t, s.Address)
	}
	return c.Send(ctx, m.Bytes())
}
