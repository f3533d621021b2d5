package syslog

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/mefor/mefor/internal/egress"
)

// Client sends messages to one receiver.
type Client struct {
	// Address is the receiver's host:port.
	Address string
	// TLS, when set, verifies the receiver (CA, server name) and may
	// present a client certificate; nil sends in plaintext TCP.
	TLS *tls.Config
	// Dial connects, through the egress policy. Defaults to a plain
	// net.Dialer.
	Dial egress.DialFunc
	// Timeout bounds one send: connecting, writing and the receiver's
	// close. Defaults to 10s.
	Timeout time.Duration
	// NoConfirm skips waiting for the receiver to close after the client
	// closed its side: the messages count as accepted once written.
	NoConfirm bool
}

// closeWriter is a connection whose sending side can be closed alone
// (*net.TCPConn, *tls.Conn).
type closeWriter interface {
	CloseWrite() error
}

// Send writes msgs, each an RFC 5424 message (Message.Bytes), octet-counted,
// on one new connection, and returns once the receiver confirmed reading
// them (see the package doc). Errors name the receiver's address and the
// step that failed, never the messages.
func (c *Client) Send(ctx context.Context, msgs ...[]byte) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var buf bytes.Buffer
	for _, m := range msgs {
		buf.WriteString(strconv.Itoa(len(m)))
		buf.WriteByte(' ')
		buf.Write(m)
	}
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	raw, err := dial(ctx, "tcp", c.Address)
	if err != nil {
		return fmt.Errorf("syslog receiver %s: connect: %w", c.Address, err)
	}
	conn := raw
	if c.TLS != nil {
		conn = tls.Client(raw, c.TLS)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if tc, ok := conn.(*tls.Conn); ok {
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("syslog receiver %s: TLS handshake: %w", c.Address, err)
		}
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("syslog receiver %s: write %d messages: %w", c.Address, len(msgs), err)
	}
	if c.NoConfirm {
		return nil
	}
	// The receiver reads its stream in order: its close after ours says
	// it read every frame before it.
	cw, ok := conn.(closeWriter)
	if !ok {
		return fmt.Errorf("syslog receiver %s: the connection cannot be half-closed to confirm %d messages", c.Address, len(msgs))
	}
	if err := cw.CloseWrite(); err != nil {
		return fmt.Errorf("syslog receiver %s: close after %d messages: %w", c.Address, len(msgs), err)
	}
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("syslog receiver %s: did not confirm reading %d messages (closing its side): %w", c.Address, len(msgs), err)
	}
	return nil
}
