package mllp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Default client timeouts, used when the corresponding Client field is zero.
const (
	DefaultDialTimeout = 10 * time.Second
	DefaultAckTimeout  = 30 * time.Second
)

var (
	// ErrAckTimeout is returned by Client.Send when the peer does not
	// acknowledge within AckTimeout. Whether it processed the message is
	// unknown.
	ErrAckTimeout = errors.New("mllp: timed out waiting for ack")

	// ErrConnClosed is returned by Client.Send when the peer closes or resets
	// the connection before a complete ACK arrives. Whether it processed the
	// message is unknown; receivers close without an ACK when they cannot
	// store a message, so sending again later is the usual response.
	ErrConnClosed = errors.New("mllp: connection closed by peer before ack")

	// ErrClientClosed is returned by Client.Send after Client.Close.
	ErrClientClosed = errors.New("mllp: client closed")
)

// DialError reports a failure to connect. Test for a refused connection
// (nothing listening) with errors.Is(err, syscall.ECONNREFUSED).
type DialError struct {
	Addr string
	Err  error
}

func (e *DialError) Error() string { return "mllp: connecting to " + e.Addr + ": " + e.Err.Error() }

func (e *DialError) Unwrap() error { return e.Err }

// Client sends messages to one MLLP peer and waits for each acknowledgement.
//
// A Client holds at most one connection: it dials on the first Send, keeps
// the connection for the sends that follow, and closes it after any failure
// so that the next Send dials afresh. A Client is safe for concurrent use,
// but sends are serialized on that connection, since MLLP allows one
// outstanding message per connection; use several Clients for parallelism.
//
// The exported fields configure the client and must not be changed once
// Send has been called.
type Client struct {
	// Addr is the peer's TCP address, host:port.
	Addr string

	// DialTimeout bounds connecting; negative means no limit beyond the
	// context's. Defaults to DefaultDialTimeout (10s).
	DialTimeout time.Duration

	// AckTimeout bounds writing a message and receiving its ACK; negative
	// means no limit beyond the context's. Defaults to DefaultAckTimeout
	// (30s).
	AckTimeout time.Duration

	// MaxFrameSize is the largest ACK accepted, in bytes. Defaults to
	// DefaultMaxFrameSize (1 MiB).
	MaxFrameSize int

	// Dialer, if set, opens connections instead of a net.Dialer; TLSDialer
	// returns one for MLLP over TLS. It is called with network "tcp".
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

	initOnce sync.Once
	sendSem  chan struct{} // holds a token while a Send runs

	mu     sync.Mutex // guards the fields below
	cc     *clientConn
	closed bool
}

type clientConn struct {
	conn net.Conn
	r    *Reader
}

func (c *Client) init() {
	c.initOnce.Do(func() { c.sendSem = make(chan struct{}, 1) })
}

// Send sends msg, a bare message without MLLP envelope, and returns the
// peer's acknowledgement, likewise without envelope and uninterpreted.
//
// Errors can be told apart with errors.Is and errors.As: *DialError,
// *HandshakeError (within a *DialError when the handshake failed; alone when
// a TLS server refused the client certificate after it), ErrAckTimeout, ErrConnClosed, ErrFrameTooLarge (the ACK exceeds
// MaxFrameSize), ErrMalformedFrame, ErrInvalidMessage (msg contains 0x1C, so
// nothing was sent), ErrClientClosed, and ctx's error if ctx ends first.
// After an error other than ErrInvalidMessage the connection is closed.
func (c *Client) Send(ctx context.Context, msg []byte) ([]byte, error) {
	if bytes.IndexByte(msg, endBlock) >= 0 {
		return nil, ErrInvalidMessage
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.init()
	select {
	case c.sendSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.sendSem }()

	cc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	ack, err := c.roundTrip(ctx, cc, msg)
	if err != nil {
		c.drop(cc)
		return nil, err
	}
	return ack, nil
}

// connect returns the open connection, if it is still usable, or dials a
// new one.
func (c *Client) connect(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClientClosed
	}
	cc := c.cc
	c.mu.Unlock()

	if cc != nil {
		if c.usable(cc) {
			return cc, nil
		}
		c.drop(cc)
	}

	dialCtx := ctx
	if d := timeout(c.DialTimeout, DefaultDialTimeout); d > 0 {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	dial := c.Dialer
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := dial(dialCtx, "tcp", c.Addr)
	if err != nil {
		return nil, &DialError{Addr: c.Addr, Err: err}
	}

	cc = &clientConn{conn: conn, r: NewReader(conn, c.MaxFrameSize)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return nil, ErrClientClosed
	}
	c.cc = cc
	return cc, nil
}

// usable reports whether an idle connection can carry the next message.
// The peer may have closed it meanwhile, most often on its idle timeout;
// finding out costs one non-blocking read and saves failing the send.
// Anything already buffered is a stray answer that would be mistaken for the
// next ACK.
func (c *Client) usable(cc *clientConn) bool {
	if cc.r.buffered() > 0 {
		return false
	}
	// The previous send's deadline has likely passed, and a socket read
	// with an expired deadline fails without looking at the socket.
	if err := cc.conn.SetReadDeadline(time.Time{}); err != nil {
		return false
	}
	return connCheck(cc.conn) == nil
}

// drop closes cc and forgets it if it is still the current connection.
func (c *Client) drop(cc *clientConn) {
	c.mu.Lock()
	if c.cc == cc {
		c.cc = nil
	}
	c.mu.Unlock()
	cc.conn.Close()
}

func (c *Client) roundTrip(ctx context.Context, cc *clientConn, msg []byte) (ack []byte, err error) {
	ackTimeout := timeout(c.AckTimeout, DefaultAckTimeout)
	if err := cc.conn.SetDeadline(deadlineAfter(ackTimeout)); err != nil {
		return nil, c.classify(ctx, "setting deadline for", err, ackTimeout)
	}
	// Cancelling ctx interrupts the I/O by moving the deadline into the past.
	stop := context.AfterFunc(ctx, func() { _ = cc.conn.SetDeadline(aLongTimeAgo) })
	defer func() {
		if !stop() && err == nil {
			// The deadline may have been moved (or be about to be) under
			// a successful exchange; the connection cannot be trusted
			// for the next one.
			c.drop(cc)
		}
	}()

	if err := WriteFrame(cc.conn, msg); err != nil {
		return nil, c.classify(ctx, "sending to", err, ackTimeout)
	}
	ack, err = cc.r.ReadFrame()
	if err != nil {
		return nil, c.classify(ctx, "reading ack from", err, ackTimeout)
	}
	return ack, nil
}

// classify turns an I/O error into one of the documented, distinguishable
// errors, keeping the underlying error in the chain.
func (c *Client) classify(ctx context.Context, op string, err error, ackTimeout time.Duration) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("mllp: %s %s: %w", op, c.Addr, ctxErr)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("mllp: %s %s: %w", op, c.Addr, ErrClientClosed)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("mllp: %s %s: no ack within %s: %w", op, c.Addr, ackTimeout, ErrAckTimeout)
	case errors.Is(err, ErrFrameTooLarge):
		return fmt.Errorf("mllp: %s %s: ack longer than %d bytes: %w", op, c.Addr, c.maxFrameSize(), err)
	case isRemoteAlert(err, new(*net.OpError)):
		// A TLS 1.3 server verifies the client's certificate after the
		// client considers the handshake done, so a refusal arrives as an
		// alert in place of the ACK. The server read nothing of the message.
		return fmt.Errorf("mllp: %s %s: %w", op, c.Addr, newHandshakeError(err))
	case isConnClosed(err):
		return fmt.Errorf("mllp: %s %s: %w: %w", op, c.Addr, ErrConnClosed, err)
	default:
		return fmt.Errorf("mllp: %s %s: %w", op, c.Addr, err)
	}
}

func (c *Client) maxFrameSize() int {
	if c.MaxFrameSize <= 0 {
		return DefaultMaxFrameSize
	}
	return c.MaxFrameSize
}

func isConnClosed(err error) bool {
	return errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED)
}

// Close closes the connection, interrupting a Send in progress. Sends after
// Close fail with ErrClientClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cc := c.cc
	c.cc = nil
	c.mu.Unlock()
	if cc == nil {
		return nil
	}
	if err := cc.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("mllp: closing connection to %s: %w", c.Addr, err)
	}
	return nil
}
