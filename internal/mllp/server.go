package mllp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Default server timeouts, used when the corresponding Server field is zero.
const (
	DefaultReadTimeout  = 30 * time.Second
	DefaultIdleTimeout  = 10 * time.Minute
	DefaultWriteTimeout = 30 * time.Second
)

// DefaultAddr is the listen address used by ListenAndServe for an empty
// address: port 2575 is the one IANA registered for HL7 over MLLP.
const DefaultAddr = ":2575"

// ErrServerClosed is returned by Serve and ListenAndServe once Shutdown has
// been called.
var ErrServerClosed = errors.New("mllp: server closed")

// ConnInfo describes the connection a message arrived on.
type ConnInfo struct {
	RemoteAddr net.Addr
	LocalAddr  net.Addr
	// TLS is the state of the completed handshake on a TLS listener, nil
	// on a plaintext one. Its VerifiedChains hold the client certificate
	// when the listener requires one (see PeerSubject).
	TLS *tls.ConnectionState
}

// A Handler processes one received message and returns the acknowledgement
// to send back.
//
// msg is the message without its MLLP envelope; the handler owns it and may
// keep it. The returned ack is likewise a bare message, which the server
// frames; it must not contain the end block byte 0x1C.
//
// Returning a nil ack closes the connection without acknowledging. That is
// what a handler should do when it cannot durably store the message: the
// sender sees no ACK and sends the message again later, whereas any ACK
// (even a negative one) may make it move on.
//
// ctx is cancelled if the peer closes the connection while the handler runs,
// or if Shutdown's deadline passes and the server forces connections closed.
// A peer that only half-closes its side counts as gone.
//
// Messages on one connection are handled one at a time, in order, so ACKs go
// back in the order the messages came in. Different connections are handled
// concurrently.
type Handler interface {
	ServeMLLP(ctx context.Context, msg []byte, conn ConnInfo) (ack []byte)
}

// HandlerFunc adapts an ordinary function to the Handler interface.
type HandlerFunc func(ctx context.Context, msg []byte, conn ConnInfo) (ack []byte)

// ServeMLLP calls f(ctx, msg, conn).
func (f HandlerFunc) ServeMLLP(ctx context.Context, msg []byte, conn ConnInfo) []byte {
	return f(ctx, msg, conn)
}

// Server accepts MLLP connections and hands each message to Handler.
//
// The exported fields configure the server and must not be changed once
// Serve has been called. A Server cannot be restarted after Shutdown.
type Server struct {
	// Handler processes received messages. It is required.
	Handler Handler

	// MaxFrameSize is the largest message accepted, in bytes. Defaults to
	// DefaultMaxFrameSize (1 MiB).
	MaxFrameSize int

	// ReadTimeout bounds the time to receive one frame, counted from its
	// start block; negative means no limit. Defaults to DefaultReadTimeout
	// (30s).
	ReadTimeout time.Duration

	// IdleTimeout closes a connection on which no frame has started for this
	// long, counted from the previous ACK (or from the connection opening).
	// Negative means no limit. Defaults to DefaultIdleTimeout (10m).
	IdleTimeout time.Duration

	// WriteTimeout bounds the time to write one ACK; negative means no
	// limit. Defaults to DefaultWriteTimeout (30s).
	WriteTimeout time.Duration

	// OnOversize builds the negative acknowledgement sent when a frame
	// exceeds MaxFrameSize, from the first MaxFrameSize bytes of its message
	// (enough to read the header and its control ID). The connection is
	// closed afterwards either way. If OnOversize is nil or returns nil, the
	// connection is closed without an answer.
	OnOversize func(prefix []byte) []byte

	// TLSConfig, when set, makes the server speak MLLP over TLS only: each
	// connection completes its handshake before any frame is read, and a
	// peer the handshake refuses is logged (remote address and reason) and
	// closed. To require client certificates, set ClientAuth to
	// tls.RequireAndVerifyClientCert and ClientCAs. A GetConfigForClient
	// that returns the current certificates lets renewed ones apply to new
	// connections without a restart.
	TLSConfig *tls.Config

	// HandshakeTimeout bounds a TLS handshake; negative means no limit.
	// Defaults to DefaultHandshakeTimeout (10s).
	HandshakeTimeout time.Duration

	// MaxRejectsInARow closes a connection once this many frames in a row
	// on it were rejected by the handler (see Reject), right after the
	// last one's answer is written. A frame the handler does not reject
	// resets the count. Zero means no limit.
	MaxRejectsInARow int

	// OnRejectsInARow, when set, is called once for each connection
	// closed for MaxRejectsInARow, before it is closed.
	OnRejectsInARow func(conn ConnInfo)

	// MaxFramesPerSecond, when positive, paces the frames this server
	// reads, all its connections together: once a frame has started to
	// arrive, its connection waits for its turn before reading it, so the
	// sender is slowed by TCP's flow control and nothing is refused. A
	// second's worth may be read at once after a quiet spell. Zero means
	// no limit.
	MaxFramesPerSecond float64

	// Paced, when set, is called with each wait MaxFramesPerSecond made a
	// connection take before reading a frame.
	Paced func(wait time.Duration)

	// HandshakeRefused, when set, is told of each TLS handshake the server
	// refused, with the peer's address, instead of the server logging it:
	// the caller counts it and decides how often to log. A peer that
	// closes before its first byte (a port probe) or a handshake cut short
	// by Shutdown is not a refusal.
	HandshakeRefused func(remote net.Addr, err *HandshakeError)

	// AckWritten, when set, is called after each ACK is written with the
	// time from the end of the frame's read to the end of the ACK's write:
	// what the sender waited for once its message was in.
	AckWritten func(elapsed time.Duration)

	// Logger receives connection-level events. Nil means no logging.
	Logger *slog.Logger

	mu         sync.Mutex
	initDone   bool
	inShutdown bool
	done       chan struct{} // closed when Shutdown starts
	baseCtx    context.Context
	cancelBase context.CancelFunc
	listeners  map[*net.Listener]struct{}
	conns      map[*conn]connState
	connWG     sync.WaitGroup
	pacer      *pacer // nil without MaxFramesPerSecond
}

// connState is where a connection is in its cycle; Shutdown closes only
// those that are idle.
type connState int

const (
	stateIdle   connState = iota // waiting for a frame to start
	stateActive                  // reading a frame, handling it or writing its ACK
)

// lazyInit prepares the server's internal state. s.mu must be held.
func (s *Server) lazyInit() {
	if s.initDone {
		return
	}
	s.initDone = true
	s.done = make(chan struct{})
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.listeners = make(map[*net.Listener]struct{})
	s.conns = make(map[*conn]connState)
	s.pacer = newPacer(s.MaxFramesPerSecond)
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// ListenAndServe listens on the TCP address addr and serves connections on
// it; an empty addr means DefaultAddr. To learn the port chosen for ":0",
// call net.Listen and Serve instead.
func (s *Server) ListenAndServe(addr string) error {
	if addr == "" {
		addr = DefaultAddr
	}
	if s.shuttingDown() {
		return ErrServerClosed
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mllp: listening on %s: %w", addr, err)
	}
	return s.Serve(ln)
}

// Serve accepts connections on ln, serving each on its own goroutine, until
// ln fails or Shutdown is called. It always closes ln and returns a non-nil
// error: ErrServerClosed after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	defer ln.Close()
	if s.Handler == nil {
		return errors.New("mllp: Server.Handler is nil")
	}
	if !s.trackListener(&ln, true) {
		return ErrServerClosed
	}
	defer s.trackListener(&ln, false)

	log := s.logger()
	log.Info("mllp server listening", "addr", ln.Addr().String())

	var backoff time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.shuttingDown() {
				return ErrServerClosed
			}
			if !isTemporary(err) {
				return fmt.Errorf("mllp: accepting on %s: %w", ln.Addr(), err)
			}
			// Typically out of file descriptors: wait for connections to
			// finish rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			log.Warn("mllp accept failed; retrying", "addr", ln.Addr().String(), "error", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-s.done:
			}
			continue
		}
		backoff = 0

		c := s.newConn(rwc)
		if !s.trackConn(c) {
			rwc.Close()
			return ErrServerClosed
		}
		go c.serve(s.baseCtx)
	}
}

// isTemporary reports whether an Accept error is worth retrying.
func isTemporary(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	// net.Error's Temporary is deprecated because it is ill-defined for most
	// errors, but it remains how the syscall layer flags EMFILE, ENFILE and
	// ECONNABORTED, which are exactly the accept errors that pass.
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// Shutdown stops the server gracefully: it closes the listeners at once,
// closes connections waiting for a frame, and lets each connection that is
// receiving a frame, running the handler or writing an ACK finish that
// frame before closing it. No new frame is started after Shutdown begins.
//
// If ctx ends first, Shutdown closes the remaining connections, cancels the
// handlers' contexts and returns ctx.Err(); handlers that ignore their
// context may still be running then.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.lazyInit()
	if !s.inShutdown {
		s.inShutdown = true
		close(s.done)
	}
	for ln := range s.listeners {
		(*ln).Close()
		delete(s.listeners, ln)
	}
	idle := 0
	for c, st := range s.conns {
		if st == stateIdle {
			c.rwc.Close()
			idle++
		}
	}
	active := len(s.conns) - idle
	s.mu.Unlock()

	log := s.logger()
	log.Info("mllp server shutting down", "idle_connections_closed", idle, "active_connections", active)

	finished := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
	}

	s.mu.Lock()
	// Connections first: a handler woken by the cancel returns at once, and
	// its reply, made for a message it was told to give up on, must find
	// the connection closed, not reach the sender.
	forced := len(s.conns)
	for c := range s.conns {
		c.rwc.Close()
	}
	s.cancelBase()
	s.mu.Unlock()
	log.Warn("mllp server shutdown deadline passed; connections force-closed", "connections", forced)
	return ctx.Err()
}

func (s *Server) shuttingDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inShutdown
}

// trackListener adds or removes ln; adding fails once shutdown has begun.
// A pointer is the key because a listener's dynamic type need not be
// comparable.
func (s *Server) trackListener(ln *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lazyInit()
	if !add {
		delete(s.listeners, ln)
		return true
	}
	if s.inShutdown {
		return false
	}
	s.listeners[ln] = struct{}{}
	return true
}

// trackConn registers a new connection as idle; it fails once shutdown has
// begun, so that Shutdown's wait covers every connection it did not see.
func (s *Server) trackConn(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inShutdown {
		return false
	}
	s.conns[c] = stateIdle
	s.connWG.Add(1)
	return true
}

func (s *Server) untrackConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// setState moves c to st. It fails once shutdown has begun, which is how a
// connection learns not to start another frame. Taking the lock here is what
// makes Shutdown's view consistent: a connection it saw as idle and closed
// cannot have started a frame, and one that had started a frame is left to
// finish it.
func (s *Server) setState(c *conn, st connState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inShutdown {
		return false
	}
	s.conns[c] = st
	return true
}

// timeout resolves a configured timeout: zero means def, negative means none
// (returned as zero).
func timeout(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	default:
		return d
	}
}

// deadlineAfter returns the deadline for an operation starting now that may take
// d, or the zero time (no deadline) when d is zero.
func deadlineAfter(d time.Duration) time.Time {
	if d == 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}
