package mllp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// addrRecorder is a handler that acknowledges and remembers which client
// connection each message came from.
type addrRecorder struct {
	mu    sync.Mutex
	addrs []string
}

func (h *addrRecorder) ServeMLLP(_ context.Context, msg []byte, info ConnInfo) []byte {
	h.mu.Lock()
	h.addrs = append(h.addrs, info.RemoteAddr.String())
	h.mu.Unlock()
	return ackOf(msg)
}

func (h *addrRecorder) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range h.addrs {
		seen[a] = true
	}
	return len(seen)
}

func newClient(t testing.TB, addr string) *Client {
	t.Helper()
	c := &Client{Addr: addr, DialTimeout: testWait, AckTimeout: testWait}
	t.Cleanup(func() { c.Close() })
	return c
}

func send(t testing.TB, c *Client, msg string) string {
	t.Helper()
	ack, err := c.Send(context.Background(), []byte(msg))
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	return string(ack)
}

func TestClientReusesConnection(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	addr, _ := startServer(t, &Server{Handler: h})
	c := newClient(t, addr)
	for i := range 5 {
		msg := fmt.Sprintf("MSH|%d", i)
		if got := send(t, c, msg); got != "ACK|"+msg {
			t.Fatalf("ack = %q", got)
		}
	}
	if n := h.distinct(); n != 1 {
		t.Fatalf("used %d connections for 5 sends, want 1", n)
	}
}

// A connection stays in use after sitting idle for longer than the ack
// timeout, whose deadline has passed by then.
func TestClientReusesConnectionAfterIdle(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	addr, _ := startServer(t, &Server{Handler: h})
	c := newClient(t, addr)
	send(t, c, "one")
	// As if the ack timeout had run out since.
	if err := c.cc.conn.SetDeadline(aLongTimeAgo); err != nil {
		t.Fatal(err)
	}
	send(t, c, "two")
	if n := h.distinct(); n != 1 {
		t.Fatalf("used %d connections, want 1", n)
	}
}

func TestClientConcurrentSends(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	addr, _ := startServer(t, &Server{Handler: h})
	c := newClient(t, addr)

	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			for j := range 10 {
				msg := fmt.Sprintf("MSH|%d|%d", i, j)
				ack, err := c.Send(context.Background(), []byte(msg))
				if err != nil || string(ack) != "ACK|"+msg {
					t.Errorf("Send(%q) = %q, %v", msg, ack, err)
				}
			}
		})
	}
	wg.Wait()
	if n := h.distinct(); n != 1 {
		t.Fatalf("used %d connections, want 1", n)
	}
}

func TestClientReconnectsAfterServerRestart(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	ln := listen(t)
	addr := ln.Addr().String()
	srv1 := &Server{Handler: h}
	_, serveErr := serve(t, srv1, ln)
	c := newClient(t, addr)
	if got := send(t, c, "before"); got != "ACK|before" {
		t.Fatalf("ack = %q", got)
	}

	if err := srv1.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	recv(t, serveErr, "Serve to return")
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	serve(t, &Server{Handler: h}, ln2)

	// The old connection was closed by the first server; Send notices
	// before using it and dials the new one.
	if got := send(t, c, "after"); got != "ACK|after" {
		t.Fatalf("ack = %q", got)
	}
	if n := h.distinct(); n != 2 {
		t.Fatalf("used %d connections, want 2", n)
	}
}

// The peer closing an idle connection (its idle timeout, typically) is
// noticed before the next send, which then succeeds on a fresh connection.
func TestClientDetectsConnectionClosedWhileIdle(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	addr, _ := startServer(t, &Server{Handler: h, IdleTimeout: 300 * time.Millisecond})
	c := newClient(t, addr)
	if got := send(t, c, "one"); got != "ACK|one" {
		t.Fatalf("ack = %q", got)
	}

	// Wait until the server's close has reached this side.
	c.mu.Lock()
	conn := c.cc.conn
	c.mu.Unlock()
	deadline := time.Now().Add(testWait)
	for connCheck(conn) == nil {
		if time.Now().After(deadline) {
			t.Fatal("idle connection never closed by the server")
		}
		time.Sleep(10 * time.Millisecond)
	}

	if got := send(t, c, "two"); got != "ACK|two" {
		t.Fatalf("ack = %q", got)
	}
	if n := h.distinct(); n != 2 {
		t.Fatalf("used %d connections, want 2", n)
	}
}

func TestClientReconnectsAfterFailure(t *testing.T) {
	t.Parallel()
	h := &addrRecorder{}
	srv := &Server{Handler: HandlerFunc(func(ctx context.Context, msg []byte, info ConnInfo) []byte {
		if string(msg) == "unstorable" {
			return nil
		}
		return h.ServeMLLP(ctx, msg, info)
	})}
	addr, _ := startServer(t, srv)
	c := newClient(t, addr)

	if got := send(t, c, "one"); got != "ACK|one" {
		t.Fatalf("ack = %q", got)
	}
	_, err := c.Send(context.Background(), []byte("unstorable"))
	if !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Send = %v, want ErrConnClosed", err)
	}
	if strings.Contains(err.Error(), "unstorable") {
		t.Fatalf("error %q leaks message bytes", err)
	}
	if got := send(t, c, "two"); got != "ACK|two" {
		t.Fatalf("ack = %q", got)
	}
	if n := h.distinct(); n != 2 {
		t.Fatalf("used %d connections, want 2", n)
	}
}

// silentServer accepts connections and reads from them but never answers.
// It reports each accepted connection.
func silentServer(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	ln := listen(t)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
			accepted <- conn
			go func() {
				buf := make([]byte, 1024)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

func TestClientAckTimeout(t *testing.T) {
	t.Parallel()
	addr, accepted := silentServer(t)
	c := &Client{Addr: addr, AckTimeout: 100 * time.Millisecond}
	defer c.Close()

	start := time.Now()
	_, err := c.Send(context.Background(), []byte("MSH"))
	if !errors.Is(err, ErrAckTimeout) {
		t.Fatalf("Send = %v, want ErrAckTimeout", err)
	}
	if elapsed := time.Since(start); elapsed > testWait/2 {
		t.Fatalf("timed out after %s, want about the ack timeout", elapsed)
	}
	first := recv(t, accepted, "first connection")

	// The timed-out connection is abandoned: an ACK arriving late on it
	// must not be taken for the next message's.
	_, err = c.Send(context.Background(), []byte("MSH"))
	if !errors.Is(err, ErrAckTimeout) {
		t.Fatalf("second Send = %v, want ErrAckTimeout", err)
	}
	if second := recv(t, accepted, "second connection"); second == first {
		t.Fatal("second send reused the timed-out connection")
	}
}

func TestClientContextCancelledWhileWaitingForAck(t *testing.T) {
	t.Parallel()
	addr, accepted := silentServer(t)
	c := newClient(t, addr)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		recv(t, accepted, "connection")
		cancel()
	}()
	_, err := c.Send(ctx, []byte("MSH"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, want context.Canceled", err)
	}
}

func TestClientContextDeadline(t *testing.T) {
	t.Parallel()
	addr, _ := silentServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Send(ctx, []byte("MSH")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send = %v, want context.DeadlineExceeded", err)
	}
}

func TestClientConnectionRefused(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now

	c := newClient(t, addr)
	_, err := c.Send(context.Background(), []byte("MSH"))
	var dialErr *DialError
	if !errors.As(err, &dialErr) {
		t.Fatalf("Send = %v, want a *DialError", err)
	}
	if dialErr.Addr != addr {
		t.Errorf("DialError.Addr = %q, want %q", dialErr.Addr, addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Send = %v, want it to match syscall.ECONNREFUSED", err)
	}
}

func TestClientCustomDialer(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, &Server{Handler: echoHandler})
	var dialed []string
	c := newClient(t, "mllp.example:2575")
	c.Dialer = func(ctx context.Context, network, a string) (net.Conn, error) {
		dialed = append(dialed, network+" "+a)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	if got := send(t, c, "MSH"); got != "ACK|MSH" {
		t.Fatalf("ack = %q", got)
	}
	if len(dialed) != 1 || dialed[0] != "tcp mllp.example:2575" {
		t.Fatalf("dialer calls = %q", dialed)
	}
}

func TestClientOversizeAck(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, &Server{Handler: HandlerFunc(func(context.Context, []byte, ConnInfo) []byte {
		return []byte(strings.Repeat("A", 100))
	})})
	c := newClient(t, addr)
	c.MaxFrameSize = 10
	if _, err := c.Send(context.Background(), []byte("MSH")); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("Send = %v, want ErrFrameTooLarge", err)
	}
}

func TestClientRejectsInvalidMessage(t *testing.T) {
	t.Parallel()
	c := newClient(t, "127.0.0.1:1") // never dialled
	if _, err := c.Send(context.Background(), []byte("MSH\x1c")); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("Send = %v, want ErrInvalidMessage", err)
	}
}

func TestClientClose(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, &Server{Handler: echoHandler})
	c := newClient(t, addr)
	send(t, c, "MSH")
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Send(context.Background(), []byte("MSH")); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("Send after Close = %v, want ErrClientClosed", err)
	}
}

func TestClientCloseInterruptsSend(t *testing.T) {
	t.Parallel()
	addr, accepted := silentServer(t)
	c := newClient(t, addr)
	go func() {
		recv(t, accepted, "connection")
		c.Close()
	}()
	if _, err := c.Send(context.Background(), []byte("MSH")); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("Send = %v, want ErrClientClosed", err)
	}
}

// A Send waiting for another to finish gives up when its context ends.
func TestClientSendWaitRespectsContext(t *testing.T) {
	t.Parallel()
	addr, accepted := silentServer(t)
	c := newClient(t, addr)
	firstDone := make(chan error, 1)
	go func() {
		_, err := c.Send(context.Background(), []byte("first"))
		firstDone <- err
	}()
	recv(t, accepted, "connection")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Send(ctx, []byte("second")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Send = %v, want context.DeadlineExceeded", err)
	}
	c.Close()
	recv(t, firstDone, "first Send to fail")
}
