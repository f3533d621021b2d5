package mllp

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Message contents are PHI: whatever happens to a message, neither the
// server's logs nor the client's errors may quote it.
func TestMessageBytesNeverLoggedOrInErrors(t *testing.T) {
	t.Parallel()
	const secret = "DOE^JOHN^SECRET"
	var logs fixtures.SyncBuffer
	srv := &Server{
		Handler: HandlerFunc(func(_ context.Context, msg []byte, _ ConnInfo) []byte {
			switch {
			case bytes.Contains(msg, []byte("PANIC-ERR")):
				panic(errors.New(string(msg)))
			case bytes.Contains(msg, []byte("PANIC")):
				panic("cannot parse " + string(msg))
			case bytes.Contains(msg, []byte("DROP")):
				return nil
			case bytes.Contains(msg, []byte("BADACK")):
				return append([]byte("\x1c"), msg...)
			}
			return ackOf(msg)
		}),
		MaxFrameSize: 256,
		ReadTimeout:  100 * time.Millisecond,
		OnOversize:   func(prefix []byte) []byte { return append([]byte("NAK|"), prefix[:10]...) },
		Logger:       slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	addr, _ := startServer(t, srv)

	streams := []string{
		frame("MSH|ok|" + secret),
		frame("MSH|PANIC|" + secret),
		frame("MSH|PANIC-ERR|" + secret),
		frame("MSH|DROP|" + secret),
		frame("MSH|BADACK|" + secret),
		frame("MSH|" + secret + strings.Repeat("x", 300)),
		"\x0bMSH|" + secret + "\x1cX",
		"\x0bMSH|" + secret, // read timeout
	}
	for i, s := range streams {
		conn, r := dial(t, addr)
		if _, err := conn.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		if i == 0 { // acknowledged; the connection stays open
			if _, err := r.ReadFrame(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for {
			if _, err := r.ReadFrame(); err != nil {
				break
			}
		}
	}

	c := newClient(t, addr)
	for _, msg := range []string{"MSH|DROP|" + secret, "MSH|" + secret + "\x1c"} {
		if _, err := c.Send(context.Background(), []byte(msg)); err == nil {
			t.Fatal("Send succeeded, want an error")
		} else if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("client error quotes the message: %v", err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "panicked") || !strings.Contains(out, "exceeds maximum size") {
		t.Fatalf("expected events missing from the logs:\n%s", out)
	}
	if strings.Contains(out, "SECRET") {
		t.Fatalf("logs quote message contents:\n%s", out)
	}
}
