package mllp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"time"
)

// After rejecting an oversize frame, or the last of too many rejected frames
// in a row, the server keeps reading, and discarding, for a while before
// closing. Closing a socket with unread data makes the
// kernel send a reset, and a reset can destroy the negative ACK before the
// sender reads it.
const (
	lingerTimeout  = time.Second
	lingerMaxBytes = 64 << 20
)

// aLongTimeAgo is a deadline in the past, used to interrupt a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// conn is the server side of one connection.
type conn struct {
	srv  *Server
	rwc  net.Conn
	r    *Reader
	info ConnInfo
	log  *slog.Logger

	readTimeout      time.Duration
	idleTimeout      time.Duration
	writeTimeout     time.Duration
	handshakeTimeout time.Duration
}

func (s *Server) newConn(rwc net.Conn) *conn {
	info := ConnInfo{RemoteAddr: rwc.RemoteAddr(), LocalAddr: rwc.LocalAddr()}
	if s.TLSConfig != nil {
		rwc = tls.Server(rwc, s.TLSConfig)
	}
	return &conn{
		srv:          s,
		rwc:          rwc,
		r:            NewReader(rwc, s.MaxFrameSize),
		info:         info,
		log:          s.logger().With("remote_addr", addrString(info.RemoteAddr)),
		readTimeout:  timeout(s.ReadTimeout, DefaultReadTimeout),
		idleTimeout:  timeout(s.IdleTimeout, DefaultIdleTimeout),
		writeTimeout: timeout(s.WriteTimeout, DefaultWriteTimeout),

		handshakeTimeout: timeout(s.HandshakeTimeout, DefaultHandshakeTimeout),
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// serve runs the connection's frame cycle until the connection ends: wait
// for a frame to start, read it, hand it to the handler, write the ACK.
func (c *conn) serve(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	opened := time.Now()
	frames := 0
	reason := "unknown"
	defer func() {
		cancel()
		c.rwc.Close()
		c.log.Debug("mllp connection closed", "reason", reason, "frames", frames,
			"discarded_bytes", c.r.Discarded(), "duration", time.Since(opened))
		c.srv.untrackConn(c) // last: Shutdown may return as soon as this runs
	}()
	c.log.Debug("mllp connection opened", "local_addr", addrString(c.info.LocalAddr))
	if !c.handshake() {
		reason = "TLS handshake failed"
		return
	}

	rejects := 0 // frames in a row the handler rejected
	for {
		if !c.srv.setState(c, stateIdle) {
			reason = "server shutting down"
			return
		}
		if err := c.rwc.SetReadDeadline(deadlineAfter(c.idleTimeout)); err != nil {
			reason = "setting idle deadline failed"
			return
		}
		if err := c.r.skipToStart(); err != nil {
			reason = c.idleEndReason(err)
			return
		}
		if !c.srv.setState(c, stateActive) {
			reason = "server shutting down"
			return
		}

		if !c.pace(ctx) {
			reason = "server shutting down"
			return
		}
		started := time.Now()
		if err := c.rwc.SetReadDeadline(deadlineAfter(c.readTimeout)); err != nil {
			reason = "setting read deadline failed"
			return
		}
		msg, err := c.r.ReadFrame()
		if errors.Is(err, ErrFrameTooLarge) {
			c.rejectOversize(msg)
			reason = "frame too large"
			return
		}
		if err != nil {
			reason = c.readFailure(err, started)
			return
		}

		handlerStart := time.Now()
		ack, rejected, ok := c.handle(ctx, msg)
		handled := time.Since(handlerStart)
		if !ok {
			reason = "handler panicked"
			return
		}
		if ack == nil {
			c.log.Info("mllp handler returned no ack; closing connection", "bytes", len(msg), "handler_duration", handled)
			reason = "handler returned no ack"
			return
		}
		if err := c.writeFrame(ack); err != nil {
			c.log.Warn("mllp writing ack failed", "ack_bytes", len(ack), "error", err)
			reason = "writing ack failed"
			return
		}
		frames++
		if c.srv.AckWritten != nil {
			c.srv.AckWritten(time.Since(handlerStart))
		}
		c.log.Debug("mllp frame handled", "bytes", len(msg), "ack_bytes", len(ack),
			"handler_duration", handled, "duration", time.Since(started))
		if rejected {
			rejects++
		} else {
			rejects = 0
		}
		if limit := c.srv.MaxRejectsInARow; limit > 0 && rejects >= limit {
			if c.srv.OnRejectsInARow != nil {
				c.srv.OnRejectsInARow(c.info)
			}
			c.lingerClose()
			reason = "too many rejected frames in a row"
			return
		}
	}
}

// pace waits for this frame's turn under the server's MaxFramesPerSecond.
// It returns false, the frame unread, when the server shuts down or the
// connection's context ends meanwhile: the sender has no answer and sends
// the message again.
func (c *conn) pace(ctx context.Context) bool {
	p := c.srv.pacer
	if p == nil {
		return true
	}
	wait := p.reserve(time.Now())
	if wait <= 0 {
		return true
	}
	if c.srv.Paced != nil {
		c.srv.Paced(wait)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.srv.done:
		return false
	case <-ctx.Done():
		return false
	}
}

// idleEndReason describes why waiting for a frame ended. None of these are
// problems: peers and the server close idle connections routinely.
func (c *conn) idleEndReason(err error) string {
	switch {
	case err == io.EOF:
		return "closed by peer"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "idle timeout"
	case errors.Is(err, net.ErrClosed):
		return "server shutting down"
	default:
		c.log.Debug("mllp connection failed while idle", "error", err)
		return "read error"
	}
}

// readFailure logs why a started frame could not be read. These deserve a
// warning: the sender meant to deliver a message and it was lost.
func (c *conn) readFailure(err error, started time.Time) string {
	reason := "read error"
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		reason = "closed by peer mid-frame"
	case errors.Is(err, os.ErrDeadlineExceeded):
		reason = "read timeout"
	case errors.Is(err, ErrMalformedFrame):
		reason = "malformed frame"
	}
	c.log.Warn("mllp frame not received; closing connection", "reason", reason,
		"error", err, "duration", time.Since(started))
	return reason
}

// handle runs the handler with panic recovery. Meanwhile it watches the
// connection so that the handler's context is cancelled if the peer goes
// away: a sender that gave up will send the message again, so there is no
// point finishing (and storing a duplicate of) this copy.
//
// rejected says the handler called Reject; ok is false if it panicked.
func (c *conn) handle(ctx context.Context, msg []byte) (ack []byte, rejected, ok bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	marks := &frameMarks{}
	ctx = context.WithValue(ctx, frameKey{}, marks)

	// Nothing else reads while the handler runs, so the watcher may use the
	// reader; it stops at the start of a next frame (a sender that did not
	// wait for its ACK) and leaves that for the frame loop.
	watchDone := make(chan struct{})
	if err := c.rwc.SetReadDeadline(time.Time{}); err == nil {
		go func() {
			defer close(watchDone)
			err := c.r.skipToStart()
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				c.log.Debug("mllp connection lost while handler running", "error", err)
				cancel()
			}
		}()
	} else {
		close(watchDone)
	}
	defer func() {
		_ = c.rwc.SetReadDeadline(aLongTimeAgo) // stop the watcher
		<-watchDone
	}()

	ack, ok = c.call("handler", func() []byte { return c.srv.Handler.ServeMLLP(ctx, msg, c.info) })
	return ack, marks.rejected.Load(), ok
}

// call runs fn, turning a panic into a logged error so that one bad message
// does not take down the server. The panic value is logged only if it is a
// runtime error: any other value may have been built from message contents.
func (c *conn) call(what string, fn func() []byte) (result []byte, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			attrs := []any{"stack", string(debug.Stack())}
			if re, isRuntime := v.(runtime.Error); isRuntime {
				attrs = append(attrs, "panic", re.Error())
			} else {
				attrs = append(attrs, "panic_type", fmt.Sprintf("%T", v))
			}
			c.log.Error("mllp "+what+" panicked; closing connection", attrs...)
			result, ok = nil, false
		}
	}()
	return fn(), true
}

// rejectOversize sends the OnOversize answer, if any, and closes the write
// side, then drains what the sender is still sending for a bounded time.
func (c *conn) rejectOversize(prefix []byte) {
	c.log.Warn("mllp frame exceeds maximum size; closing connection", "max_frame_size", c.r.MaxFrameSize())
	if c.srv.OnOversize != nil {
		nak, ok := c.call("OnOversize", func() []byte { return c.srv.OnOversize(prefix) })
		if ok && nak != nil {
			if err := c.writeFrame(nak); err != nil {
				c.log.Warn("mllp writing oversize nak failed", "ack_bytes", len(nak), "error", err)
			}
		}
	}
	c.lingerClose()
}

// lingerClose closes the write side, then drains what the sender is still
// sending for a bounded time, so that the last answer is not destroyed by
// the reset that closing a socket with unread data sends.
func (c *conn) lingerClose() {
	if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	if err := c.rwc.SetReadDeadline(time.Now().Add(lingerTimeout)); err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(c.rwc, lingerMaxBytes))
	}
}

func (c *conn) writeFrame(msg []byte) error {
	if err := c.rwc.SetWriteDeadline(deadlineAfter(c.writeTimeout)); err != nil {
		return fmt.Errorf("mllp: setting write deadline: %w", err)
	}
	return WriteFrame(c.rwc, msg)
}
