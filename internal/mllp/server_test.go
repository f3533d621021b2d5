package mllp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestServerRoundTrip(t *testing.T) {
	t.Parallel()
	var gotInfo ConnInfo
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, info ConnInfo) []byte {
			gotInfo = info
			return ackOf(msg)
		}),
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)

	if got := exchange(t, conn, r, "MSH|1"); got != "ACK|MSH|1" {
		t.Fatalf("ack = %q", got)
	}
	if gotInfo.RemoteAddr.String() != conn.LocalAddr().String() || gotInfo.LocalAddr.String() != addr {
		t.Fatalf("ConnInfo = %v -> %v, want %v -> %v", gotInfo.RemoteAddr, gotInfo.LocalAddr, conn.LocalAddr(), addr)
	}
	// Stray bytes between frames are tolerated.
	if _, err := conn.Write([]byte("\r\n")); err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, conn, r, "MSH|2"); got != "ACK|MSH|2" {
		t.Fatalf("ack = %q", got)
	}
}

func TestServerConcurrentConnections(t *testing.T) {
	t.Parallel()
	const conns, frames = 50, 10
	var active, peak atomic.Int32
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			n := active.Add(1)
			defer active.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			return ackOf(msg)
		}),
	}
	addr, _ := startServer(t, srv)

	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Go(func() {
			conn, err := net.DialTimeout("tcp", addr, testWait)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(testWait))
			r := NewReader(conn, 0)
			for j := range frames {
				msg := fmt.Sprintf("MSH|conn%d|frame%d", i, j)
				if err := WriteFrame(conn, []byte(msg)); err != nil {
					errs <- err
					return
				}
				ack, err := r.ReadFrame()
				if err != nil {
					errs <- fmt.Errorf("conn %d frame %d: %w", i, j, err)
					return
				}
				if string(ack) != "ACK|"+msg {
					errs <- fmt.Errorf("conn %d frame %d: ack %q out of order", i, j, ack)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("peak concurrent handlers: %d", peak.Load())
}

// Frames sent back to back without waiting for ACKs are still handled one
// at a time and acknowledged in order.
func TestServerPipelinedFramesKeepOrder(t *testing.T) {
	t.Parallel()
	var running atomic.Int32
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			if running.Add(1) != 1 {
				t.Error("handlers overlapped on one connection")
			}
			defer running.Add(-1)
			return ackOf(msg)
		}),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	var stream []byte
	for i := range 20 {
		stream = fmt.Appendf(stream, "\x0bMSH|%d\x1c\r", i)
	}
	if _, err := conn.Write(stream); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		ack, err := r.ReadFrame()
		if err != nil || string(ack) != fmt.Sprintf("ACK|MSH|%d", i) {
			t.Fatalf("ack %d = %q, %v", i, ack, err)
		}
	}
}

func TestServerOversizeFrame(t *testing.T) {
	t.Parallel()
	const max = 1024
	prefixes := make(chan []byte, 1)
	srv := &Server{
		Handler:      echoHandler,
		MaxFrameSize: max,
		OnOversize: func(prefix []byte) []byte {
			prefixes <- prefix
			return []byte("NAK|too large")
		},
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)

	// Fine up to the limit.
	if got := exchange(t, conn, r, strings.Repeat("a", max)); got != "ACK|"+strings.Repeat("a", max) {
		t.Fatalf("ack for a maximum-size frame has %d bytes", len(got))
	}

	// Larger than the limit, and more than the socket buffers hold, so the
	// server must answer while the sender is still sending.
	big := "MSH|" + strings.Repeat("b", 4<<20)
	writeErr := make(chan error, 1)
	go func() { writeErr <- WriteFrame(conn, []byte(big)) }()

	if prefix := recv(t, prefixes, "OnOversize"); string(prefix) != big[:max] {
		t.Fatalf("OnOversize got %d bytes, want the first %d of the message", len(prefix), max)
	}
	ack, err := r.ReadFrame()
	if err != nil || string(ack) != "NAK|too large" {
		t.Fatalf("ReadFrame() = %q, %v; want the oversize NAK", ack, err)
	}
	expectClosed(t, r)
	// The write either completed into the draining server or was cut off
	// when it closed; both are fine, but it must not hang.
	recv(t, writeErr, "write of the oversize frame")
}

func TestServerOversizeWithoutCallbackJustCloses(t *testing.T) {
	t.Parallel()
	srv := &Server{Handler: echoHandler, MaxFrameSize: 8}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	if err := WriteFrame(conn, []byte("MSH|0123456789")); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, r)
}

func TestServerReadTimeout(t *testing.T) {
	t.Parallel()
	srv := &Server{
		Handler:     echoHandler,
		ReadTimeout: 100 * time.Millisecond,
		IdleTimeout: time.Hour,
		Logger:      testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)

	start := time.Now()
	if _, err := conn.Write([]byte("\x0bMSH|never finished")); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, r)
	if elapsed := time.Since(start); elapsed > testWait/2 {
		t.Fatalf("closed after %s, want about the read timeout", elapsed)
	}
}

func TestServerIdleTimeout(t *testing.T) {
	t.Parallel()
	srv := &Server{
		Handler:     echoHandler,
		ReadTimeout: time.Hour,
		IdleTimeout: 100 * time.Millisecond,
		Logger:      testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)

	// Stray bytes between frames do not start a frame: were they taken
	// for one, the hour-long read timeout would keep the connection open.
	if _, err := conn.Write([]byte("\r\n")); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, r)
}

func TestServerHandlerNilAckClosesConnection(t *testing.T) {
	t.Parallel()
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			if string(msg) == "store fails" {
				return nil
			}
			return ackOf(msg)
		}),
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	if got := exchange(t, conn, r, "MSH"); got != "ACK|MSH" {
		t.Fatalf("ack = %q", got)
	}
	if err := WriteFrame(conn, []byte("store fails")); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, r)
}

func TestServerHandlerPanicClosesConnectionOnly(t *testing.T) {
	t.Parallel()
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			if string(msg) == "boom" {
				panic("secret message contents")
			}
			return ackOf(msg)
		}),
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)

	conn, r := dial(t, addr)
	if err := WriteFrame(conn, []byte("boom")); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, r)

	conn2, r2 := dial(t, addr)
	if got := exchange(t, conn2, r2, "MSH"); got != "ACK|MSH" {
		t.Fatalf("server unusable after a handler panic: ack = %q", got)
	}
}

func TestServerHandlerContextCancelledWhenPeerCloses(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	cancelled := make(chan error, 1)
	srv := &Server{
		Handler: HandlerFunc(func(ctx context.Context, _ []byte, _ ConnInfo) []byte {
			close(entered)
			select {
			case <-ctx.Done():
				cancelled <- ctx.Err()
			case <-time.After(testWait):
				cancelled <- errors.New("context not cancelled")
			}
			return nil
		}),
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, _ := dial(t, addr)
	if err := WriteFrame(conn, []byte("MSH")); err != nil {
		t.Fatal(err)
	}
	recv(t, entered, "handler to start")
	conn.Close()
	if err := recv(t, cancelled, "handler to finish"); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler context: %v", err)
	}
}

// Graceful shutdown: the listener goes at once, idle connections are
// closed, and a handler already running finishes and its ACK is delivered
// before its connection closes.
func TestServerShutdownGraceful(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var handlerCtxErr atomic.Value
	srv := &Server{
		Handler: HandlerFunc(func(ctx context.Context, msg []byte, _ ConnInfo) []byte {
			if string(msg) == "slow" {
				entered <- struct{}{}
				<-release
				if err := ctx.Err(); err != nil {
					handlerCtxErr.Store(err)
				}
			}
			return ackOf(msg)
		}),
		Logger: testLogger(t),
	}
	addr, serveErr := startServer(t, srv)

	idleConn, idleR := dial(t, addr)
	if got := exchange(t, idleConn, idleR, "MSH"); got != "ACK|MSH" {
		t.Fatalf("ack = %q", got)
	}
	busyConn, busyR := dial(t, addr)
	if err := WriteFrame(busyConn, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	recv(t, entered, "slow handler to start")

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- srv.Shutdown(context.Background()) }()

	if err := recv(t, serveErr, "Serve to return"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v, want ErrServerClosed", err)
	}
	if _, err := net.DialTimeout("tcp", addr, testWait); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial during shutdown: %v, want connection refused", err)
	}
	expectClosed(t, idleR)

	select {
	case err := <-shutdownErr:
		t.Fatalf("Shutdown returned %v while a handler was running", err)
	default:
	}
	close(release)

	ack, err := busyR.ReadFrame()
	if err != nil || string(ack) != "ACK|slow" {
		t.Fatalf("in-flight ack = %q, %v", ack, err)
	}
	expectClosed(t, busyR) // no new frame after the in-flight one
	if err := recv(t, shutdownErr, "Shutdown to return"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := handlerCtxErr.Load(); err != nil {
		t.Fatalf("graceful shutdown cancelled the handler's context: %v", err)
	}

	if err := srv.Serve(listen(t)); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown = %v, want ErrServerClosed", err)
	}
}

// A frame that has started arriving when Shutdown begins is read, handled
// and acknowledged.
func TestServerShutdownWaitsForFrameBeingRead(t *testing.T) {
	t.Parallel()
	srv := &Server{Handler: echoHandler, Logger: testLogger(t)}
	addr, serveErr := startServer(t, srv)
	conn, r := dial(t, addr)

	// Half a frame, then wait until the server has seen its start block
	// (which is what makes the frame in flight) before shutting down.
	if got := exchange(t, conn, r, "first"); got != "ACK|first" {
		t.Fatalf("ack = %q", got)
	}
	waitForState(t, srv, stateIdle)
	if _, err := conn.Write([]byte("\x0bsecond-")); err != nil {
		t.Fatal(err)
	}
	waitForState(t, srv, stateActive)

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- srv.Shutdown(context.Background()) }()
	recv(t, serveErr, "Serve to return")
	if _, err := conn.Write([]byte("half\x1c\r")); err != nil {
		t.Fatal(err)
	}
	ack, err := r.ReadFrame()
	if err != nil || string(ack) != "ACK|second-half" {
		t.Fatalf("ack = %q, %v", ack, err)
	}
	expectClosed(t, r)
	if err := recv(t, shutdownErr, "Shutdown to return"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// waitForState polls until the server's only connection is in state st.
func waitForState(t *testing.T, srv *Server, st connState) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for time.Now().Before(deadline) {
		srv.mu.Lock()
		n, matched := len(srv.conns), 0
		for _, s := range srv.conns {
			if s == st {
				matched++
			}
		}
		srv.mu.Unlock()
		if n == 1 && matched == 1 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("connection never reached state %d", st)
}

// When Shutdown's context ends first, connections are forced closed and
// handlers see their context cancelled.
func TestServerShutdownDeadline(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	handlerErr := make(chan error, 1)
	srv := &Server{
		Handler: HandlerFunc(func(ctx context.Context, _ []byte, _ ConnInfo) []byte {
			close(entered)
			select {
			case <-ctx.Done():
				handlerErr <- ctx.Err()
			case <-time.After(testWait):
				handlerErr <- errors.New("context not cancelled")
			}
			return []byte("ACK|late")
		}),
		Logger: testLogger(t),
	}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	if err := WriteFrame(conn, []byte("MSH")); err != nil {
		t.Fatal(err)
	}
	recv(t, entered, "handler to start")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want context.DeadlineExceeded", err)
	}
	if err := recv(t, handlerErr, "handler to finish"); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler context: %v", err)
	}
	expectClosed(t, r)
}

// flakyListener fails its first Accepts with a temporary error, as a
// listener does when the process is out of file descriptors.
type flakyListener struct {
	net.Listener
	failures atomic.Int32
}

type temporaryError struct{}

func (temporaryError) Error() string   { return "too many open files" }
func (temporaryError) Timeout() bool   { return false }
func (temporaryError) Temporary() bool { return true }

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: temporaryError{}}
	}
	return l.Listener.Accept()
}

func TestServerRetriesTemporaryAcceptErrors(t *testing.T) {
	t.Parallel()
	ln := &flakyListener{Listener: listen(t)}
	ln.failures.Store(3)
	addr, _ := serve(t, &Server{Handler: echoHandler, Logger: testLogger(t)}, ln)
	conn, r := dial(t, addr)
	if got := exchange(t, conn, r, "MSH"); got != "ACK|MSH" {
		t.Fatalf("ack = %q", got)
	}
}

type brokenListener struct{ net.Listener }

var errBroken = errors.New("listener broken")

func (brokenListener) Accept() (net.Conn, error) { return nil, errBroken }

func TestServerReturnsPermanentAcceptError(t *testing.T) {
	t.Parallel()
	srv := &Server{Handler: echoHandler}
	_, serveErr := serve(t, srv, brokenListener{listen(t)})
	if err := recv(t, serveErr, "Serve to return"); !errors.Is(err, errBroken) {
		t.Fatalf("Serve = %v, want it to wrap the accept error", err)
	}
}

func TestServerRequiresHandler(t *testing.T) {
	t.Parallel()
	if err := (&Server{}).Serve(listen(t)); err == nil || errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve without a handler = %v", err)
	}
}

func TestListenAndServeAfterShutdown(t *testing.T) {
	t.Parallel()
	srv := &Server{Handler: echoHandler}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.ListenAndServe("127.0.0.1:0"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ListenAndServe = %v, want ErrServerClosed", err)
	}
}
