package admission_test

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// testWait bounds what a test waits for; only a broken gate reaches it.
const testWait = 10 * time.Second

// server is a gated listener on 127.0.0.1 that reads every connection it
// accepts to its end, recording what each sent by its source address.
type server struct {
	addr     string
	gate     *admission.Gate
	refused  sync.Map // admission.Reason → *atomic.Int32
	log      *fixtures.SyncBuffer
	mu       sync.Mutex
	accepted map[string]int    // remote IP → connections accepted
	read     map[string][]byte // remote IP → bytes read
	conns    []net.Conn
}

func newServer(t *testing.T, p admission.Policy) *server {
	t.Helper()
	s := &server{log: &fixtures.SyncBuffer{}, accepted: map[string]int{}, read: map[string][]byte{}}
	s.gate = admission.NewGate(p, admission.Options{
		Refused: func(r admission.Reason) { s.counter(r).Add(1) },
		Logger:  slog.New(slog.NewTextHandler(s.log, nil)),
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	gated := s.gate.Listener(ln)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := gated.Accept()
			if err != nil {
				return
			}
			ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			s.mu.Lock()
			s.accepted[ip]++
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					s.mu.Lock()
					s.read[ip] = append(s.read[ip], buf[:n]...)
					s.mu.Unlock()
					if err != nil {
						c.Close()
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s
}

func (s *server) counter(r admission.Reason) *atomic.Int32 {
	v, _ := s.refused.LoadOrStore(r, &atomic.Int32{})
	return v.(*atomic.Int32)
}

func (s *server) acceptedFrom(ip string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[ip]
}

// dial connects from the loopback address from (all of 127/8 is loopback
// on Linux) and writes hello.
func dial(t *testing.T, from, to string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: testWait}
	c, err := d.Dial("tcp", to)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatalf("write from %s: %v", from, err)
	}
	return c
}

// closedByServer reports whether the server closed c: a read ends at once
// with EOF or a reset.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(testWait))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logLines are the lines of log that contain substr.
func logLines(log *fixtures.SyncBuffer, substr string) []string {
	var out []string
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

func mustSources(t *testing.T, entries ...string) *admission.Sources {
	t.Helper()
	s, err := admission.NewSources(entries)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A connection from a source outside the allow list is closed before the
// server reads a byte of it, counted as not_allowed and logged with its
// address; one from an allowed source is served.
func TestGateRefusesSourcesNotAllowed(t *testing.T) {
	s := newServer(t, admission.Policy{Allow: mustSources(t, "127.0.0.1", "10.0.0.0/8")})

	stranger := dial(t, "127.0.0.2", s.addr)
	if !closedByServer(stranger) {
		t.Fatal("the connection from 127.0.0.2 was not closed")
	}
	if got := s.counter(admission.NotAllowed).Load(); got != 1 {
		t.Errorf("not_allowed counted %d times, want 1", got)
	}
	friend := dial(t, "127.0.0.1", s.addr)
	eventually(t, "the allowed sender's bytes read", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return string(s.read["127.0.0.1"]) == "hello"
	})
	if n := s.acceptedFrom("127.0.0.2"); n != 0 {
		t.Errorf("the server was handed %d connections from 127.0.0.2", n)
	}
	s.mu.Lock()
	if got := s.read["127.0.0.2"]; len(got) != 0 {
		t.Errorf("the server read %q from the refused source", got)
	}
	s.mu.Unlock()
	if lines := logLines(s.log, "connection refused"); len(lines) != 1 ||
		!strings.Contains(lines[0], "remote_addr=127.0.0.2:") || !strings.Contains(lines[0], "reason=not_allowed") {
		t.Errorf("log lines %q, want one naming 127.0.0.2 and not_allowed", lines)
	}
	friend.Close()
}

// Over max_connections_per_ip a source's next connection is closed at
// once and counted; other sources still get in up to max_connections;
// closing a connection frees its place.
func TestGateCapsConnections(t *testing.T) {
	s := newServer(t, admission.Policy{MaxConnections: 3, MaxConnectionsPerIP: 2})
	a1, a2 := dial(t, "127.0.0.2", s.addr), dial(t, "127.0.0.2", s.addr)
	eventually(t, "two connections from 127.0.0.2", func() bool { return s.acceptedFrom("127.0.0.2") == 2 })
	if !closedByServer(dial(t, "127.0.0.2", s.addr)) {
		t.Fatal("a third connection from 127.0.0.2 was not closed")
	}
	dial(t, "127.0.0.3", s.addr)
	eventually(t, "a connection from 127.0.0.3", func() bool { return s.acceptedFrom("127.0.0.3") == 1 })
	if !closedByServer(dial(t, "127.0.0.4", s.addr)) {
		t.Fatal("a fourth connection to the listener was not closed")
	}
	if per, all := s.counter(admission.MaxConnectionsPerIP).Load(), s.counter(admission.MaxConnections).Load(); per != 1 || all != 1 {
		t.Errorf("refused: max_connections_per_ip %d, max_connections %d; want 1 each", per, all)
	}
	if got := s.gate.Open(); got != 3 {
		t.Errorf("gate holds %d connections, want 3", got)
	}

	// The peer closes; the server sees it and closes its end.
	a1.Close()
	eventually(t, "the closed connection's place freed", func() bool { return s.gate.Open() == 2 })
	dial(t, "127.0.0.2", s.addr)
	eventually(t, "a new connection from 127.0.0.2", func() bool { return s.acceptedFrom("127.0.0.2") == 3 })
	_ = a2
}

// A source refused again and again is logged once a minute, its next line
// saying how many refusals went unlogged; another source has lines of its
// own. Every refusal is counted.
func TestGateLogsEachSourceOnceAMinute(t *testing.T) {
	s := newServer(t, admission.Policy{Allow: mustSources(t, "127.0.0.1")})
	now := time.Date(2026, 1, 1, 8, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	s.gate.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	refuse := func(from string, n int) {
		for range n {
			closedByServer(dial(t, from, s.addr))
		}
	}
	refuse("127.0.0.2", 5)
	refuse("127.0.0.3", 1)
	eventually(t, "six refusals counted", func() bool { return s.counter(admission.NotAllowed).Load() == 6 })
	if got := len(logLines(s.log, "remote_addr=127.0.0.2:")); got != 1 {
		t.Errorf("127.0.0.2 refused 5 times within a minute: %d log lines, want 1", got)
	}
	if got := len(logLines(s.log, "remote_addr=127.0.0.3:")); got != 1 {
		t.Errorf("127.0.0.3: %d log lines, want 1", got)
	}
	advance(59 * time.Second)
	refuse("127.0.0.2", 1)
	eventually(t, "seven refusals counted", func() bool { return s.counter(admission.NotAllowed).Load() == 7 })
	if got := len(logLines(s.log, "remote_addr=127.0.0.2:")); got != 1 {
		t.Errorf("after 59s: %d log lines for 127.0.0.2, want still 1", got)
	}
	advance(time.Second)
	refuse("127.0.0.2", 1)
	eventually(t, "eight refusals counted", func() bool { return s.counter(admission.NotAllowed).Load() == 8 })
	lines := logLines(s.log, "remote_addr=127.0.0.2:")
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged_since_last=5") {
		t.Errorf("after a minute: lines %q, want a second one counting the 5 refusals not logged", lines)
	}
}

// Refusals from more sources than the gate remembers are logged together,
// once a minute, and the gate's memory of sources stays bounded.
func TestGateLogBoundedOverManySources(t *testing.T) {
	buf := &fixtures.SyncBuffer{}
	g := admission.NewGate(admission.Policy{}, admission.Options{Logger: slog.New(slog.NewTextHandler(buf, nil))})
	now := time.Date(2026, 1, 1, 8, 0, 0, 0, time.UTC)
	g.SetClock(func() time.Time { return now })
	const sources = 5000
	for i := range sources {
		ip := net.IPv6loopback
		ip = append(net.IP{}, ip...)
		ip[12], ip[13] = byte(i>>8), byte(i)
		g.Refused(&net.TCPAddr{IP: ip, Port: 1}, admission.NotAllowed)
	}
	per, many := len(logLines(buf, "msg=\"connection refused\"")), len(logLines(buf, "many sources"))
	if per != 4096 || many != 1 {
		t.Errorf("%d sources refused within a minute: %d lines of their own and %d together, want 4096 and 1", sources, per, many)
	}
}

// An admitted connection keeps the half-close of the connection it wraps,
// which a server uses to finish an answer before closing.
func TestGateConnHalfCloses(t *testing.T) {
	g := admission.NewGate(admission.Policy{}, admission.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gated := g.Listener(ln)
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := gated.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the admitted connection has no CloseWrite")
	}
	if _, err := c.Write([]byte("AR")); err != nil {
		t.Fatal(err)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "AR" {
		t.Fatalf("client read %q, %v; want the answer, then EOF", got, err)
	}
	if _, err := client.Write([]byte("still open")); err != nil {
		t.Fatalf("the server's read side closed too: %v", err)
	}
}
