package connector

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

const adt = "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|C1|P|2.5\rPID|1||42\r"

// partner is a TLS MLLP receiver that acknowledges AA and counts what it
// received.
func partner(t *testing.T, cert tls.Certificate) (addr string, received *atomic.Int32) {
	t.Helper()
	received = new(atomic.Int32)
	srv := &mllp.Server{
		Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
			received.Add(1)
			m, err := hl7.Parse(raw)
			if err != nil {
				return nil
			}
			return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return ln.Addr().String(), received
}

// sendVia builds the destination from a config naming caFile and sends one
// message through a pool, as a drainer does.
func sendVia(t *testing.T, address, caFile, serverName string) Result {
	t.Helper()
	sn := ""
	if serverName != "" {
		sn = fmt.Sprintf(", server_name: %q", serverName)
	}
	cfg := adtTo(t, "lab", fmt.Sprintf(`  lab:
    type: mllp
    mllp: {address: %q, connect_timeout: 5s, tls: {ca_file: %q%s}}
`, address, caFile, sn), nil)
	return sendOne(t, cfg, "lab", nil)
}

func TestMLLPOverTLSDelivers(t *testing.T) {
	ca := certtest.NewCA(t, "Lab CA")
	addr, received := partner(t, ca.Issue(t, "lab", certtest.Options{}).TLS)
	res := sendVia(t, addr, ca.WriteFile(t, t.TempDir(), "ca.crt"), "")
	if !res.OK || res.Outcome != OutcomeDelivered || res.AckCode != "AA" {
		t.Fatalf("result %+v, want delivered AA", res)
	}
	if received.Load() != 1 {
		t.Fatalf("partner received %d messages", received.Load())
	}
}

// A partner whose certificate does not verify gets nothing, and the
// attempt says so with its own outcome and the reason.
func TestTLSVerificationFailureIsOutcomeTLS(t *testing.T) {
	ca, other := certtest.NewCA(t, "Lab CA"), certtest.NewCA(t, "Someone else")
	expired := ca.Issue(t, "lab", certtest.Options{NotBefore: time.Now().Add(-3 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	for _, tt := range []struct {
		name       string
		cert       tls.Certificate
		ca         *certtest.CA
		serverName string
		reason     string
	}{
		{"unknown authority", ca.Issue(t, "lab", certtest.Options{}).TLS, other, "", mllp.ReasonUnknownAuthority},
		{"expired", expired.TLS, ca, "", mllp.ReasonExpired},
		{"name mismatch", ca.Issue(t, "lab", certtest.Options{}).TLS, ca, "lab.example.org", mllp.ReasonNameMismatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, received := partner(t, tt.cert)
			res := sendVia(t, addr, tt.ca.WriteFile(t, t.TempDir(), "ca.crt"), tt.serverName)
			if res.OK || res.Outcome != OutcomeTLS {
				t.Fatalf("result %+v, want outcome %q", res, OutcomeTLS)
			}
			if !strings.HasPrefix(res.Error, "tls: ") || !strings.Contains(res.Error, tt.reason) || !strings.Contains(res.Error, addr) {
				t.Errorf("error %q does not give the outcome, the partner and the reason %q", res.Error, tt.reason)
			}
			if strings.Contains(res.Error, "PID") {
				t.Errorf("error carries message content: %q", res.Error)
			}
			if n := received.Load(); n != 0 {
				t.Fatalf("partner received %d messages over a connection that did not verify", n)
			}
		})
	}
}
