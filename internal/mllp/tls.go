package mllp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// MLLP over TLS.
//
// A server with a TLSConfig completes the handshake on each connection,
// within HandshakeTimeout, before it reads any frame: a peer that speaks
// plaintext, presents no certificate when one is required, or presents one
// the configured CAs did not sign is refused before a single message byte
// is read, so nothing from it can be stored. The client side (TLSDialer)
// likewise completes and verifies the handshake before Client.Send writes
// the message, so a partner whose certificate does not verify is sent
// nothing.

// DefaultHandshakeTimeout bounds a TLS handshake when
// Server.HandshakeTimeout is zero.
const DefaultHandshakeTimeout = 10 * time.Second

// Reasons a handshake fails, as HandshakeError.Reason reports them. They
// are short and stable so that logs and delivery outcomes can be searched.
const (
	ReasonExpired          = "certificate expired or not yet valid"
	ReasonUnknownAuthority = "unknown authority"
	ReasonNameMismatch     = "name mismatch"
	ReasonBadUsage         = "certificate not valid for this use"
	ReasonNoCertificate    = "no client certificate"
	ReasonNotTLS           = "peer does not speak TLS"
	ReasonRefusedByPeer    = "refused by peer"
	ReasonNoCommonVersion  = "no common TLS version or cipher"
	ReasonTimeout          = "handshake timeout"
	ReasonClosed           = "closed during handshake"
	ReasonOther            = "handshake failed"
)

// HandshakeError is a TLS handshake that failed, on either side. Reason
// classifies it (one of the Reason constants); Err is what crypto/tls said.
// Neither holds message content: no frame is read or written before the
// handshake completes.
type HandshakeError struct {
	Reason string
	Err    error
}

func (e *HandshakeError) Error() string {
	return "TLS handshake failed (" + e.Reason + "): " + e.Err.Error()
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// newHandshakeError classifies err, which a TLS handshake (or the first
// read after it, where TLS 1.3 reports a refused client certificate)
// returned.
func newHandshakeError(err error) *HandshakeError {
	var he *HandshakeError
	if errors.As(err, &he) {
		return he
	}
	return &HandshakeError{Reason: handshakeReason(err), Err: err}
}

func handshakeReason(err error) string {
	var (
		invalid  x509.CertificateInvalidError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		header   tls.RecordHeaderError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return ReasonExpired
	case errors.As(err, &invalid) && invalid.Reason == x509.IncompatibleUsage:
		return ReasonBadUsage
	case errors.As(err, &unknown):
		return ReasonUnknownAuthority
	case errors.As(err, &hostname):
		return ReasonNameMismatch
	case errors.As(err, &header):
		return ReasonNotTLS
	case isRemoteAlert(err, &op):
		return ReasonRefusedByPeer // which alert is in Err
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ReasonClosed
	}
	// crypto/tls reports these as plain errors; their text is all there is.
	switch msg := err.Error(); {
	case strings.Contains(msg, "didn't provide a certificate"):
		return ReasonNoCertificate
	case strings.Contains(msg, "protocol version"), strings.Contains(msg, "unsupported versions"),
		strings.Contains(msg, "no cipher suite"), strings.Contains(msg, "no mutual cipher"):
		return ReasonNoCommonVersion
	}
	return ReasonOther
}

// isRemoteAlert reports whether err is a TLS alert the peer sent, which
// crypto/tls wraps in a *net.OpError with Op "remote error".
func isRemoteAlert(err error, op **net.OpError) bool {
	return errors.As(err, op) && (*op).Op == "remote error"
}

// TLSDialer returns a Client.Dialer that opens TLS connections. The
// handshake completes, and the peer's certificate is verified, before the
// connection is returned, within the dial's context (Client.DialTimeout).
// config is called at each dial, so a renewed certificate or CA is used
// by the next connection while open ones carry on; a config without a
// ServerName gets the host of the address dialed. A failed handshake is
// returned as a *HandshakeError.
func TLSDialer(config func() *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return TLSDialerVia(nil, config)
}

// TLSDialerVia is TLSDialer over the connections dial opens (an egress
// policy's, say); nil dials with a net.Dialer. A dial error is returned as
// dial returned it.
func TLSDialerVia(dial func(ctx context.Context, network, addr string) (net.Conn, error),
	config func() *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := config()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, newHandshakeError(err)
		}
		return tc, nil
	}
}

// handshake runs the server side of the TLS handshake on c, bounded by the
// server's handshake timeout. It returns false, having logged why, when
// the peer is refused; the caller closes the connection.
func (c *conn) handshake() bool {
	tc, ok := c.rwc.(*tls.Conn)
	if !ok {
		return true
	}
	if err := tc.SetDeadline(deadlineAfter(c.handshakeTimeout)); err != nil {
		return false
	}
	err := tc.Handshake()
	if err == nil {
		err = tc.SetDeadline(time.Time{})
	}
	if err != nil {
		switch {
		case c.srv.shuttingDown():
			c.log.Debug("mllp TLS handshake interrupted by shutdown")
		case errors.Is(err, io.EOF):
			// A port probe (a load balancer's TCP check) connects and
			// closes without a word: nothing was refused.
			c.log.Debug("mllp connection closed before the TLS handshake")
		case c.srv.HandshakeRefused != nil:
			c.srv.HandshakeRefused(c.info.RemoteAddr, newHandshakeError(err))
		default:
			he := newHandshakeError(err)
			c.log.Warn("mllp TLS handshake refused; closing connection", "reason", he.Reason, "error", err)
		}
		return false
	}
	st := tc.ConnectionState()
	c.info.TLS = &st
	if len(st.VerifiedChains) > 0 {
		c.log = c.log.With("peer", st.VerifiedChains[0][0].Subject.String())
	}
	return true
}

// PeerSubject returns the subject of the verified client certificate the
// connection presented, or "" when it presented none that was verified
// (a plaintext connection, or a TLS listener without client CAs).
func (info ConnInfo) PeerSubject() string {
	if info.TLS == nil || len(info.TLS.VerifiedChains) == 0 || len(info.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	return info.TLS.VerifiedChains[0][0].Subject.String()
}
