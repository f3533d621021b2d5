package mllp

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rejectingHandler answers every frame, and rejects those starting with
// BAD, as intake does for a frame that does not parse.
var rejectingHandler = HandlerFunc(func(ctx context.Context, msg []byte, _ ConnInfo) []byte {
	if strings.HasPrefix(string(msg), "BAD") {
		Reject(ctx)
	}
	return ackOf(msg)
})

// A connection is closed right after the answer to its MaxRejectsInARow-th
// rejected frame in a row; a frame not rejected starts the count again, and
// the callback hears of the close once, with the sender's address. Another
// connection is served as before.
func TestServerClosesAfterRejectsInARow(t *testing.T) {
	var mu sync.Mutex
	var closed []net.Addr
	srv := &Server{Handler: rejectingHandler, MaxRejectsInARow: 3, Logger: testLogger(t),
		OnRejectsInARow: func(c ConnInfo) {
			mu.Lock()
			defer mu.Unlock()
			closed = append(closed, c.RemoteAddr)
		}}
	addr, _ := startServer(t, srv)

	conn, r := dial(t, addr)
	for _, msg := range []string{"BAD1", "BAD2", "GOOD", "BAD3", "BAD4", "BAD5"} {
		if ack := exchange(t, conn, r, msg); ack != string(ackOf([]byte(msg))) {
			t.Fatalf("%s answered %q", msg, ack)
		}
	}
	// The server may close before or after this write lands; either way no
	// answer comes.
	_ = WriteFrame(conn, []byte("GOOD"))
	expectClosed(t, r)

	mu.Lock()
	got := append([]net.Addr(nil), closed...)
	mu.Unlock()
	if len(got) != 1 || got[0].String() != conn.LocalAddr().String() {
		t.Fatalf("OnRejectsInARow called for %v, want once for the sender %s", got, conn.LocalAddr())
	}

	other, r2 := dial(t, addr)
	if ack := exchange(t, other, r2, "BAD6"); ack != "ACK|BAD6" {
		t.Fatalf("another connection's frame answered %q", ack)
	}
}

// Rejected frames sent back to back, without waiting for their answers,
// still get every answer up to the limit before the close: the server
// drains what follows instead of resetting the connection over unread data.
func TestServerRejectsInARowAnswersReachPipeliningSender(t *testing.T) {
	srv := &Server{Handler: rejectingHandler, MaxRejectsInARow: 5, Logger: testLogger(t)}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	big := "BAD" + strings.Repeat("x", 64<<10)
	go func() {
		for range 20 {
			if WriteFrame(conn, []byte(big)) != nil {
				return
			}
		}
	}()
	for i := range 5 {
		ack, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		if len(ack) != len(big)+4 {
			t.Fatalf("answer %d is %d bytes", i+1, len(ack))
		}
	}
	expectClosed(t, r)
}

// Without a limit, rejected frames never close the connection.
func TestServerRejectsWithoutLimitKeepConnection(t *testing.T) {
	srv := &Server{Handler: rejectingHandler, Logger: testLogger(t)}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	for i := range 50 {
		if ack := exchange(t, conn, r, "BAD"); ack != "ACK|BAD" {
			t.Fatalf("frame %d answered %q", i+1, ack)
		}
	}
}

// Reject outside a handler's context does nothing (and does not panic).
func TestRejectOutsideHandler(t *testing.T) {
	Reject(context.Background())
}

// The pacer lets one second's worth through at once, then one frame per
// interval; a quiet spell refills it, never beyond one second's worth.
func TestPacerSpacesFramesAfterABurst(t *testing.T) {
	p := newPacer(5) // 200ms apart, 5 at once
	now := time.Unix(1000, 0)
	var waits []time.Duration
	for range 8 {
		waits = append(waits, p.reserve(now))
	}
	want := []time.Duration{0, 0, 0, 0, 0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits at one instant = %v, want %v", waits, want)
		}
	}
	// An hour later the bucket is full again, but holds no more than 5.
	later := now.Add(time.Hour)
	for i := range 5 {
		if w := p.reserve(later); w != 0 {
			t.Fatalf("frame %d after a quiet hour waits %s, want none", i+1, w)
		}
	}
	if w := p.reserve(later); w != 200*time.Millisecond {
		t.Fatalf("sixth frame after a quiet hour waits %s, want 200ms", w)
	}

	if newPacer(0) != nil {
		t.Fatal("a zero rate makes a pacer, want none")
	}
	slow := newPacer(0.5) // one frame every 2s, no burst beyond it
	if w0, w1 := slow.reserve(now), slow.reserve(now); w0 != 0 || w1 != 2*time.Second {
		t.Fatalf("at 0.5/s the first two frames wait %s and %s, want 0 and 2s", w0, w1)
	}
}

// A paced server reads frames no faster than its rate, all connections
// together, answers every one in order, and reports each wait. 12 frames at
// 10/s with a burst of 10 need at least 2 intervals (200ms) after the
// first: a lower bound, which only a server that does not pace can miss.
func TestServerPacesFramesOfAllConnections(t *testing.T) {
	var waited atomic.Int64
	var paced atomic.Int32
	srv := &Server{Handler: echoHandler, MaxFramesPerSecond: 10, Logger: testLogger(t),
		Paced: func(d time.Duration) { paced.Add(1); waited.Add(int64(d)) }}
	addr, _ := startServer(t, srv)
	a, ra := dial(t, addr)
	b, rb := dial(t, addr)
	start := time.Now()
	for i := range 6 {
		for _, c := range []struct {
			conn net.Conn
			r    *Reader
			name string
		}{{a, ra, "a"}, {b, rb, "b"}} {
			msg := c.name + string(rune('0'+i))
			if ack := exchange(t, c.conn, c.r, msg); ack != "ACK|"+msg {
				t.Fatalf("%s answered %q", msg, ack)
			}
		}
	}
	if elapsed := time.Since(start); elapsed < 200*time.Millisecond {
		t.Fatalf("12 frames at 10/s took %s, want at least 200ms", elapsed)
	}
	if n := paced.Load(); n < 2 {
		t.Fatalf("Paced called %d times, want at least 2 (the 11th and 12th frames)", n)
	}
}

// A connection waiting for its turn is closed by Shutdown without its frame
// being read or handled: the sender gets no answer and sends it again.
func TestServerShutdownEndsPacingWait(t *testing.T) {
	handled := make(chan string, 4)
	waiting := make(chan time.Duration, 4)
	srv := &Server{MaxFramesPerSecond: 0.01, Logger: testLogger(t), // one frame per 100s
		Paced: func(d time.Duration) { waiting <- d },
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			handled <- string(msg)
			return ackOf(msg)
		})}
	ln := listen(t)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	conn, r := dial(t, ln.Addr().String())
	if ack := exchange(t, conn, r, "first"); ack != "ACK|first" {
		t.Fatalf("first answered %q", ack)
	}
	if err := WriteFrame(conn, []byte("second")); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, waiting, "the second frame to wait for its turn"); d < time.Minute {
		t.Fatalf("the second frame waits %s, want about 100s", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown waited for the paced connection: %v", err)
	}
	expectClosed(t, r)
	recv(t, errc, "Serve to return")
	if got := len(handled); got != 1 {
		t.Fatalf("%d frames handled, want only the first", got)
	}
}
