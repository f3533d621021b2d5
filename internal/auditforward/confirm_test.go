package auditforward_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/certtest"
)

// receiver is a syslog-over-TLS receiver that reads octet-counted frames
// until the client closes its side, then closes its own, unless hold is
// set: then it keeps the connection open, as a receiver that never
// confirms.
func receiver(t *testing.T, ca *certtest.CA, hold bool) (addr string, frames chan []string) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", certtest.Options{}).TLS}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	frames = make(chan []string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				var got []string
				for {
					n, err := r.ReadString(' ')
					if err != nil {
						break
					}
					size, _ := strconv.Atoi(strings.TrimSpace(n))
					msg := make([]byte, size)
					if _, err := io.ReadFull(r, msg); err != nil {
						break
					}
					got = append(got, string(msg))
				}
				frames <- got
				if hold {
					time.Sleep(5 * time.Second)
				}
			}()
		}
	}()
	return ln.Addr().String(), frames
}

func oneRow() []auditforward.Item {
	return []auditforward.Item{{Row: &audit.Record{Seq: 1, At: time.Now(), Action: `re"play]`, Outcome: "ok", Target: []byte(`{"message_id":1}`), Hash: "ab"}}}
}

// A batch counts as accepted only once the receiver closed its side after
// reading it: one that keeps the connection open is not taken as having
// read the batch, unless confirmation is off.
func TestSyslogBatchIsAcceptedOnlyWhenTheReceiverConfirms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := certtest.NewCA(t, "syslog CA")
	send := func(addr string, noConfirm bool) error {
		s := &auditforward.Syslog{Address: addr, Hostname: "node a", AppName: "mefor", Facility: 13, Timeout: time.Second,
			TLS: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}, NoConfirm: noConfirm}
		return s.Send(ctx, oneRow())
	}

	addr, frames := receiver(t, ca, false)
	if err := send(addr, false); err != nil {
		t.Fatalf("a receiver that read the batch and closed: %v", err)
	}
	got := <-frames
	if len(got) != 1 || !strings.HasPrefix(got[0], `<109>1 `) ||
		!strings.Contains(got[0], ` nodea mefor - audit [mefor@32473 seq="1" action="re\"play\]" outcome="ok" hash="ab"] {`) {
		t.Fatalf("the receiver got %q, want one RFC 5424 message with escaped structured data", got)
	}

	addr, _ = receiver(t, ca, true)
	err := send(addr, false)
	if err == nil || !strings.Contains(err.Error(), "did not confirm reading 1 messages") {
		t.Fatalf("a receiver that never closed: %v, want the batch not accepted", err)
	}
	if err := send(addr, true); err != nil {
		t.Fatalf("with confirmation off, a written batch counts as sent: %v", err)
	}
}
