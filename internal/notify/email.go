package notify

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/mail"
	"net/smtp"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
)

// sendMail mails n to every recipient of sink's email: STARTTLS first
// (required when configured: a server that does not offer it gets
// nothing), then AUTH PLAIN when a username is set, then one message.
// Errors name the server's address and the step, never the password.
func sendMail(ctx context.Context, t Transport, sink *config.AlertSink, n *Notification) error {
	e := sink.Email
	ctx, cancel := context.WithTimeout(ctx, e.Timeout)
	defer cancel()
	fail := func(step string, err error) error {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return fmt.Errorf("SMTP server %s: %s: no answer within %s", e.Address, step, e.Timeout)
		}
		return fmt.Errorf("SMTP server %s: %s: %w", e.Address, step, err)
	}
	from, err := mail.ParseAddress(e.From)
	if err != nil {
		return fmt.Errorf("alert sink %s: from does not parse as a mail address", sink.Name)
	}
	to := make([]*mail.Address, len(e.To))
	for i, s := range e.To {
		if to[i], err = mail.ParseAddress(s); err != nil {
			return fmt.Errorf("alert sink %s: to[%d] does not parse as a mail address", sink.Name, i)
		}
	}
	msg, err := mailMessage(from, to, n)
	if err != nil {
		return err
	}

	conn, err := t.Egress.Dialer(Target(sink.Name))(ctx, "tcp", e.Address)
	if err != nil {
		return fail("connect", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	host, _, _ := net.SplitHostPort(e.Address)
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		return fail("greeting", err)
	}
	defer c.Close()
	if e.StartTLS {
		if ok, _ := c.Extension("STARTTLS"); !ok {
			return fmt.Errorf("SMTP server %s does not offer STARTTLS, which starttls requires; nothing was sent", e.Address)
		}
		if err := c.StartTLS(tlsFor(t, e.Address)); err != nil {
			return fail("STARTTLS", err)
		}
	}
	if e.Username != "" {
		if ok, _ := c.Extension("AUTH"); !ok {
			return fmt.Errorf("SMTP server %s does not offer AUTH, and a username is configured; nothing was sent", e.Address)
		}
		if err := c.Auth(plainAuth{user: e.Username, password: e.Password}); err != nil {
			return fail("AUTH as "+e.Username, err)
		}
	}
	if err := c.Mail(from.Address); err != nil {
		return fail("MAIL FROM", err)
	}
	for _, a := range to {
		if err := c.Rcpt(a.Address); err != nil {
			return fail("RCPT TO "+a.Address, err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return fail("DATA", err)
	}
	if _, err := w.Write(msg); err != nil {
		return fail("DATA", err)
	}
	if err := w.Close(); err != nil {
		// The server's answer to the message: accepted or not.
		return fail("end of DATA", err)
	}
	_ = c.Quit() // the mail is accepted; a failed goodbye changes nothing
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// plainAuth is SMTP AUTH PLAIN (RFC 4616). Unlike smtp.PlainAuth it does
// not refuse an unencrypted connection to another host itself: config
// already refused that unless plaintext: true acknowledges it.
type plainAuth struct{ user, password string }

func (a plainAuth) Start(*smtp.ServerInfo) (string, []byte, error) {
	return "PLAIN", []byte("\x00" + a.user + "\x00" + a.password), nil
}

func (a plainAuth) Next(_ []byte, more bool) ([]byte, error) {
	if more {
		return nil, errors.New("the server asked for more than AUTH PLAIN sends")
	}
	return nil, nil
}

// Subject is the subject of n's mail: it names the state and the rule.
func Subject(n *Notification) string {
	s := "[mefor] " + n.State + ": " + n.Rule
	if w := n.watched(); w != "" {
		s += " (" + w + ")"
	}
	return s
}

// mailMessage is the mail of n: headers, then the summary, the fields and
// the notification as JSON, in plain text.
func mailMessage(from *mail.Address, to []*mail.Address, n *Notification) ([]byte, error) {
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	_, domain, _ := strings.Cut(from.Address, "@")
	var b bytes.Buffer
	header := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	header("From", from.String())
	tos := make([]string, len(to))
	for i, a := range to {
		tos[i] = a.String()
	}
	header("To", strings.Join(tos, ", "))
	header("Subject", mime.QEncoding.Encode("utf-8", Subject(n)))
	header("Date", time.Now().Format(time.RFC1123Z))
	header("Message-ID", "<"+hex.EncodeToString(id)+".alert@"+domain+">")
	header("Auto-Submitted", "auto-generated")
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "8bit")
	b.WriteString("\r\n")
	b.WriteString(n.Summary + "\r\n\r\n")
	field := func(k, v string) {
		if v != "" {
			b.WriteString(fmt.Sprintf("%-12s %s\r\n", k+":", v))
		}
	}
	field("rule", n.Rule)
	field("state", n.State)
	field("destination", n.Destination)
	field("channel", n.Channel)
	field("audit forward", n.AuditForward)
	if n.Condition != "" {
		field("condition", n.Condition)
		field("value", fmt.Sprintf("%g %s", n.Value, n.Unit))
		field("threshold", fmt.Sprintf("%g %s", n.Threshold, n.Unit))
	}
	field("since", n.Since.UTC().Format(time.RFC3339))
	js, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode alert %s for mail: %w", n.Rule, err)
	}
	b.WriteString("\r\n")
	b.Write(bytes.ReplaceAll(js, []byte("\n"), []byte("\r\n")))
	b.WriteString("\r\n")
	return b.Bytes(), nil
}
