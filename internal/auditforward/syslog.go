package auditforward

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/syslog"
)

// Syslog sends each item as one RFC 5424 message over TLS (RFC 5425), each
// framed by octet counting, one connection per batch, through package
// syslog. Every message has severity notice.
//
// A row's message has MSGID "audit", its time, structured data naming its
// seq, action and outcome, and the row as JSON for its MSG; an anchor's
// has MSGID "anchor" and the anchor as JSON.
type Syslog struct {
	// Address is the receiver's host:port.
	Address string
	// TLS verifies the receiver (CA, server name) and may present a
	// client certificate.
	TLS *tls.Config
	// Dial connects through the egress policy.
	Dial egress.DialFunc
	// Hostname is the HOSTNAME field: the node that forwards.
	Hostname string
	// AppName is the APP-NAME field. Defaults to "mefor".
	AppName string
	// Facility is the syslog facility number, 0 to 23 (audit.forward
	// defaults it to 13, log audit).
	Facility int
	// Timeout bounds one batch: connecting, writing and the receiver's
	// close. Defaults to 10s.
	Timeout time.Duration
	// NoConfirm skips waiting for the receiver to close after the
	// close_notify: the batch counts as accepted once written.
	NoConfirm bool
}

// Send implements Sender.
func (s *Syslog) Send(ctx context.Context, items []Item) error {
	msgs := make([][]byte, 0, len(items))
	for _, it := range items {
		msg, err := s.message(it)
		if err != nil {
			return err
		}
		msgs = append(msgs, msg)
	}
	c := &syslog.Client{Address: s.Address, TLS: s.TLS, Dial: s.Dial, Timeout: s.Timeout, NoConfirm: s.NoConfirm}
	if c.TLS == nil {
		// There is no plaintext audit forwarding.
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return c.Send(ctx, msgs...)
}

// message formats one item as an RFC 5424 message.
func (s *Syslog) message(it Item) ([]byte, error) {
	m := syslog.Message{Facility: s.Facility, Severity: syslog.SeverityNotice, Hostname: s.Hostname, AppName: s.AppName}
	if m.AppName == "" {
		m.AppName = "mefor"
	}
	var body any
	switch {
	case it.Row != nil:
		r := it.Row
		m.Time, m.MsgID, body = r.At, "audit", r
		m.Params = []syslog.Param{syslog.P("seq", strconv.FormatInt(r.Seq, 10)), syslog.P("action", r.Action),
			syslog.P("outcome", r.Outcome), syslog.P("hash", r.Hash)}
	case it.Anchor != nil:
		a := it.Anchor
		m.Time, m.MsgID, body = a.TakenAt, "anchor", a
		m.Params = []syslog.Param{syslog.P("anchor", strconv.FormatInt(a.No, 10)), syslog.P("seq", strconv.FormatInt(a.Seq, 10)),
			syslog.P("hash", a.Hash)}
	default:
		return nil, errors.New("empty audit forward item")
	}
	js, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode audit %s for syslog: %w", m.MsgID, err)
	}
	m.Msg = js
	return m.Bytes(), nil
}
