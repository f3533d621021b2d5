package auditforward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/egress"
)

// Syslog sends each item as one RFC 5424 message over TLS (RFC 5425), each
// framed by octet counting (its length in decimal, a space, the message),
// one connection per batch.
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

// severityNotice is the severity of every message (5: notice, "normal but
// significant condition").
const severityNotice = 5

// structuredDataID names mefor's structured data element; 32473 is the
// private enterprise number set aside for examples (RFC 5612), as no
// number is registered for mefor.
const structuredDataID = "mefor@32473"

// Send implements Sender.
func (s *Syslog) Send(ctx context.Context, items []Item) (err error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var buf bytes.Buffer
	for _, it := range items {
		msg, err := s.message(it)
		if err != nil {
			return err
		}
		buf.WriteString(strconv.Itoa(len(msg)))
		buf.WriteByte(' ')
		buf.Write(msg)
	}
	dial := s.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	raw, err := dial(ctx, "tcp", s.Address)
	if err != nil {
		return fmt.Errorf("syslog receiver %s: connect: %w", s.Address, err)
	}
	conn := tls.Client(raw, s.TLS)
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := conn.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("syslog receiver %s: TLS handshake: %w", s.Address, err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("syslog receiver %s: write %d messages: %w", s.Address, len(items), err)
	}
	if s.NoConfirm {
		return nil
	}
	// The receiver reads its stream in order: its close after our
	// close_notify says it read every frame before it.
	if err := conn.CloseWrite(); err != nil {
		return fmt.Errorf("syslog receiver %s: close after %d messages: %w", s.Address, len(items), err)
	}
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("syslog receiver %s: did not confirm reading %d messages (closing its side): %w", s.Address, len(items), err)
	}
	return nil
}

// message formats one item as an RFC 5424 message.
func (s *Syslog) message(it Item) ([]byte, error) {
	facility := s.Facility
	app := s.AppName
	if app == "" {
		app = "mefor"
	}
	var at time.Time
	var msgID, sd string
	var body any
	switch {
	case it.Row != nil:
		r := it.Row
		at, msgID, body = r.At, "audit", r
		sd = "[" + structuredDataID + ` seq="` + strconv.FormatInt(r.Seq, 10) + `" action="` + sdEscape(r.Action) +
			`" outcome="` + sdEscape(r.Outcome) + `" hash="` + r.Hash + `"]`
	case it.Anchor != nil:
		a := it.Anchor
		at, msgID, body = a.TakenAt, "anchor", a
		sd = "[" + structuredDataID + ` anchor="` + strconv.FormatInt(a.No, 10) + `" seq="` + strconv.FormatInt(a.Seq, 10) +
			`" hash="` + a.Hash + `"]`
	default:
		return nil, errors.New("empty audit forward item")
	}
	js, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode audit %s for syslog: %w", msgID, err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "<%d>1 %s %s %s - %s %s ", facility*8+severityNotice, at.UTC().Format("2006-01-02T15:04:05.000000Z"),
		header(s.Hostname), header(app), msgID, sd)
	b.Write(js)
	return b.Bytes(), nil
}

// header makes v a valid RFC 5424 header field: printable US-ASCII without
// spaces, "-" when empty.
func header(v string) string {
	v = strings.Map(func(r rune) rune {
		if r < 33 || r > 126 {
			return -1
		}
		return r
	}, v)
	if v == "" {
		return "-"
	}
	return v
}

// sdEscape escapes a structured data parameter value (RFC 5424 6.3.3).
func sdEscape(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, `]`, `\]`).Replace(v)
}
