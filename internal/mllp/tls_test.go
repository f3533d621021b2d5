package mllp

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
)

// logRecorder keeps the records a server logs, and shows them in the test
// log too.
type logRecorder struct {
	t  testing.TB
	mu sync.Mutex
	// attrs of each record, with the message under "msg".
	records []map[string]string
	pre     []slog.Attr
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range h.pre {
		rec[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { rec[a.Key] = a.Value.String(); return true })
	h.t.Log(rec)
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &withAttrs{h, attrs}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

type withAttrs struct {
	*logRecorder
	attrs []slog.Attr
}

func (w *withAttrs) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(w.attrs...)
	return w.logRecorder.Handle(ctx, r)
}

func (w *withAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &withAttrs{w.logRecorder, append(append([]slog.Attr{}, w.attrs...), attrs...)}
}

// find returns the records whose message is msg.
func (h *logRecorder) find(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.records {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// tlsFixture is a CA with a server certificate and a client certificate it
// signed, and a second CA nobody trusts.
type tlsFixture struct {
	ca, other      *certtest.CA
	server, client *certtest.Cert
}

func newTLSFixture(t *testing.T) *tlsFixture {
	ca := certtest.NewCA(t, "Test Partners CA")
	return &tlsFixture{
		ca:     ca,
		other:  certtest.NewCA(t, "Untrusted CA"),
		server: ca.Issue(t, "mefor.test", certtest.Options{}),
		client: ca.Issue(t, "partner-a", certtest.Options{}),
	}
}

// mutualServer is a server requiring client certificates signed by f.ca.
func (f *tlsFixture) mutualServer() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{f.server.TLS},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// tlsServer starts a TLS MLLP server that counts the messages it handles
// and records what it logs.
func tlsServer(t *testing.T, cfg *tls.Config) (addr string, handled *atomic.Int32, subjects chan string, logs *logRecorder) {
	t.Helper()
	handled = new(atomic.Int32)
	subjects = make(chan string, 16)
	logs = &logRecorder{t: t}
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, info ConnInfo) []byte {
			handled.Add(1)
			subjects <- info.PeerSubject()
			return ackOf(msg)
		}),
		TLSConfig:        cfg,
		HandshakeTimeout: 2 * time.Second,
		Logger:           slog.New(logs),
	}
	addr, _ = startServer(t, srv)
	return addr, handled, subjects, logs
}

func tlsClient(addr string, cfg *tls.Config) *Client {
	return &Client{Addr: addr, AckTimeout: testWait, DialTimeout: testWait, Dialer: TLSDialer(func() *tls.Config { return cfg })}
}

func TestTLSMutualAccepted(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	addr, handled, subjects, _ := tlsServer(t, f.mutualServer())
	c := tlsClient(addr, &tls.Config{RootCAs: f.ca.Pool(), Certificates: []tls.Certificate{f.client.TLS}})
	defer c.Close()

	for i, msg := range []string{"MSH|1", "MSH|2"} {
		ack, err := c.Send(context.Background(), []byte(msg))
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if string(ack) != "ACK|"+msg {
			t.Fatalf("ack = %q", ack)
		}
		if got := recv(t, subjects, "peer subject"); got != "CN=partner-a,O=mefor tests" {
			t.Errorf("message %d: peer subject %q, want the client certificate's", i, got)
		}
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("handled %d messages, want 2", n)
	}
}

// A sender the handshake refuses gets no ACK, its message never reaches
// the handler, and the refusal is logged once, with the remote address and
// the reason.
func TestTLSServerRefuses(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	stranger := f.other.Issue(t, "stranger", certtest.Options{})
	for _, tt := range []struct {
		name   string
		send   func(addr string) error
		reason string
	}{
		{
			name: "no client certificate",
			send: func(addr string) error {
				c := tlsClient(addr, &tls.Config{RootCAs: f.ca.Pool()})
				defer c.Close()
				_, err := c.Send(context.Background(), []byte("MSH|secret"))
				return err
			},
			reason: ReasonNoCertificate,
		},
		{
			name: "certificate from another CA",
			send: func(addr string) error {
				// Go's client keeps back a certificate whose issuer the server
				// did not ask for; other clients send it anyway.
				c := tlsClient(addr, &tls.Config{RootCAs: f.ca.Pool(),
					GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stranger.TLS, nil }})
				defer c.Close()
				_, err := c.Send(context.Background(), []byte("MSH|secret"))
				return err
			},
			reason: ReasonUnknownAuthority,
		},
		{
			name: "plaintext",
			send: func(addr string) error {
				c := &Client{Addr: addr, AckTimeout: testWait}
				defer c.Close()
				_, err := c.Send(context.Background(), []byte("MSH|secret"))
				return err
			},
			reason: ReasonNotTLS,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, handled, _, logs := tlsServer(t, f.mutualServer())
			err := tt.send(addr)
			if err == nil {
				t.Fatal("send succeeded, want it refused")
			}
			t.Logf("sender saw: %v", err)
			var refused []map[string]string
			deadline := time.Now().Add(testWait)
			for len(refused) == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
				refused = logs.find("mllp TLS handshake refused; closing connection")
			}
			if len(refused) != 1 {
				t.Fatalf("logged %d refusals, want 1", len(refused))
			}
			if r := refused[0]; r["reason"] != tt.reason || r["remote_addr"] == "" || r["level"] != "WARN" {
				t.Errorf("refusal logged as %v, want reason %q with the remote address", r, tt.reason)
			}
			for _, r := range logs.records {
				for k, v := range r {
					if strings.Contains(v, "secret") {
						t.Errorf("log attribute %s carries message content: %q", k, v)
					}
				}
			}
			if n := handled.Load(); n != 0 {
				t.Fatalf("handler ran %d times for a refused sender", n)
			}
		})
	}
}

// The client verifies the partner before sending: a certificate that does
// not verify means the partner is sent nothing, and the error says why.
func TestTLSClientVerifiesPartner(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	expired := f.ca.Issue(t, "mefor.test", certtest.Options{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	for _, tt := range []struct {
		name       string
		serverCert tls.Certificate
		client     *tls.Config
		reason     string
	}{
		{"unknown authority", f.server.TLS, &tls.Config{RootCAs: f.other.Pool()}, ReasonUnknownAuthority},
		{"expired", expired.TLS, &tls.Config{RootCAs: f.ca.Pool()}, ReasonExpired},
		{"name mismatch", f.server.TLS, &tls.Config{RootCAs: f.ca.Pool(), ServerName: "lab.example.org"}, ReasonNameMismatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, handled, _, _ := tlsServer(t, &tls.Config{Certificates: []tls.Certificate{tt.serverCert}})
			c := tlsClient(addr, tt.client)
			defer c.Close()
			_, err := c.Send(context.Background(), []byte("MSH|1"))
			var dial *DialError
			var hs *HandshakeError
			if !errors.As(err, &dial) || !errors.As(err, &hs) {
				t.Fatalf("err = %v (%T), want a *DialError holding a *HandshakeError", err, err)
			}
			if hs.Reason != tt.reason {
				t.Errorf("reason %q, want %q (%v)", hs.Reason, tt.reason, err)
			}
			time.Sleep(50 * time.Millisecond)
			if n := handled.Load(); n != 0 {
				t.Fatalf("partner handled %d messages from a client that did not trust it", n)
			}
		})
	}
}

// A sender that connects and says nothing is cut off at the handshake
// timeout instead of holding a connection until the idle timeout.
func TestTLSHandshakeTimeout(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	logs := &logRecorder{t: t}
	srv := &Server{Handler: echoHandler, TLSConfig: f.mutualServer(), HandshakeTimeout: 200 * time.Millisecond, Logger: slog.New(logs)}
	addr, _ := startServer(t, srv)
	conn, r := dial(t, addr)
	if _, err := conn.Write([]byte{0x16}); err != nil { // a record header's first byte, then silence
		t.Fatal(err)
	}
	start := time.Now()
	expectClosed(t, r)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %s, want about the 200ms handshake timeout", d)
	}
	refused := logs.find("mllp TLS handshake refused; closing connection")
	if len(refused) != 1 || refused[0]["reason"] != ReasonTimeout {
		t.Fatalf("refusals logged: %v, want one with reason %q", refused, ReasonTimeout)
	}
}

// A partner that closed an idle TLS connection is noticed before the next
// send, which then goes out on a fresh connection instead of failing.
func TestTLSClientRedialsAfterPeerClosedIdle(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	var conns atomic.Int32
	cfg := f.mutualServer()
	cfg.VerifyConnection = func(tls.ConnectionState) error { conns.Add(1); return nil }
	srv := &Server{Handler: echoHandler, TLSConfig: cfg, IdleTimeout: 100 * time.Millisecond}
	addr, _ := startServer(t, srv)
	c := tlsClient(addr, &tls.Config{RootCAs: f.ca.Pool(), Certificates: []tls.Certificate{f.client.TLS}})
	defer c.Close()

	if _, err := c.Send(context.Background(), []byte("MSH|1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the server closes the idle connection
	if _, err := c.Send(context.Background(), []byte("MSH|2")); err != nil {
		t.Fatalf("send after the partner closed the idle connection: %v", err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the second after the idle close)", n)
	}
}

// A port probe that connects and closes is not a refusal worth a warning.
func TestTLSProbeIsNotARefusal(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	addr, _, _, logs := tlsServer(t, f.mutualServer())
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	time.Sleep(100 * time.Millisecond)
	if r := logs.find("mllp TLS handshake refused; closing connection"); len(r) != 0 {
		t.Fatalf("a connect-and-close probe was logged as refused: %v", r)
	}
}

// With HandshakeRefused set, each refused handshake is handed to it, with
// the peer's address, instead of being logged; a port probe that closes
// without a word is not a refusal.
func TestTLSHandshakeRefusedHook(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	type refusal struct {
		remote string
		reason string
	}
	got := make(chan refusal, 4)
	logs := &logRecorder{t: t}
	srv := &Server{
		Handler:          echoHandler,
		TLSConfig:        f.mutualServer(),
		HandshakeTimeout: 2 * time.Second,
		Logger:           slog.New(logs),
		HandshakeRefused: func(remote net.Addr, err *HandshakeError) { got <- refusal{remote.String(), err.Reason} },
	}
	addr, _ := startServer(t, srv)

	probe, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	c := tlsClient(addr, &tls.Config{RootCAs: f.ca.Pool()})
	defer c.Close()
	if _, err := c.Send(context.Background(), []byte("MSH|1")); err == nil {
		t.Fatal("a sender without a certificate was accepted")
	}
	r := recv(t, got, "the refusal")
	if r.reason != ReasonNoCertificate || !strings.HasPrefix(r.remote, "127.0.0.1:") {
		t.Errorf("refusal %+v, want no client certificate from 127.0.0.1", r)
	}
	deadline := time.Now().Add(testWait)
	for len(logs.find("mllp connection closed before the TLS handshake")) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(logs.find("mllp connection closed before the TLS handshake")) != 1 {
		t.Fatal("the server did not see the probe close")
	}
	select {
	case r := <-got:
		t.Errorf("a second refusal %+v: the probe counted as one", r)
	default:
	}
	if n := len(logs.find("mllp TLS handshake refused; closing connection")); n != 0 {
		t.Errorf("the server logged %d refusals itself", n)
	}
}
