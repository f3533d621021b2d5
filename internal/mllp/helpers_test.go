package mllp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Generous bound for anything a test waits on; only a broken implementation
// should ever hit it.
const testWait = 10 * time.Second

// ackOf is the ACK the echo handler returns for msg.
func ackOf(msg []byte) []byte { return append([]byte("ACK|"), msg...) }

var echoHandler = HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte { return ackOf(msg) })

// testLogger logs through t, so a failing test shows what the server saw.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// serve runs srv on ln and shuts it down when the test ends. It returns
// the address and a channel that receives Serve's result.
func serve(t testing.TB, srv *Server, ln net.Listener) (string, <-chan error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return ln.Addr().String(), errc
}

// startServer serves srv on a fresh loopback port.
func startServer(t testing.TB, srv *Server) (string, <-chan error) {
	t.Helper()
	return serve(t, srv, listen(t))
}

// dial connects to addr with a deadline that keeps a broken test from
// hanging.
func dial(t testing.TB, addr string) (net.Conn, *Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, testWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(testWait)); err != nil {
		t.Fatal(err)
	}
	return conn, NewReader(conn, 0)
}

// exchange sends msg on conn and returns the ACK read from r.
func exchange(t testing.TB, conn net.Conn, r *Reader, msg string) string {
	t.Helper()
	if err := WriteFrame(conn, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	ack, err := r.ReadFrame()
	if err != nil {
		t.Fatalf("reading ack: %v", err)
	}
	return string(ack)
}

// expectClosed checks that the server closes the connection without sending
// anything more.
func expectClosed(t testing.TB, r *Reader) {
	t.Helper()
	msg, err := r.ReadFrame()
	switch {
	case err == nil:
		t.Fatalf("got a %d-byte frame, want the connection closed", len(msg))
	case err == io.EOF, errors.Is(err, syscall.ECONNRESET):
	default:
		t.Fatalf("got %v, want the connection closed", err)
	}
}

// recv waits for a value on ch.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
