package connector

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

// answers pins each name to fixed addresses, as the DNS answered when
// the config was loaded.
type answers map[string][]netip.Addr

func (a answers) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return a[host], nil
}

// sendThrough sends one message to the destination of yaml (a
// destinations: block of one destination, lab) through a pool whose egress
// policy pins localhost to pinned, and returns the result and the
// refusals reported.
func sendThrough(t *testing.T, yaml, pinned string) (Result, []*egress.RefusedError) {
	t.Helper()
	cfg := adtTo(t, "lab", yaml+"egress: {allow: [localhost]}\n", nil)
	var refused []*egress.RefusedError
	policy, errs := egress.NewPolicy(context.Background(), cfg.Egress.Allow, cfg.OutboundHosts(), egress.Options{
		Resolver: answers{"localhost": {netip.MustParseAddr(pinned)}},
		OnRefuse: func(r *egress.RefusedError) { refused = append(refused, r) },
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var gate egress.Gate
	gate.Store(policy)
	return sendOne(t, cfg, "lab", func(p *Pool) { p.UseEgress(&gate) }), refused
}

// A destination named by a host whose address changed since the config
// was loaded gets nothing, over MLLP and MLLP over TLS: the attempt's
// outcome is egress, its error names the destination and addresses (no
// content), one refusal is reported. With the name pinned to the address
// it has now, the same destination is delivered to.
func TestMLLPDestinationRefusedWhenItsNameMoved(t *testing.T) {
	ca := certtest.NewCA(t, "Lab CA")
	caFile := ca.WriteFile(t, t.TempDir(), "ca.crt")
	plainAddr, plainGot := plainPartner(t)
	tlsAddr, tlsGot := partner(t, ca.Issue(t, "localhost", certtest.Options{}).TLS)
	for _, tt := range []struct {
		name, addr, tls string
		got             *atomic.Int32
	}{
		{"plaintext", plainAddr, "", plainGot},
		{"TLS", tlsAddr, fmt.Sprintf(", tls: {ca_file: %q}", caFile), tlsGot},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, port, _ := net.SplitHostPort(tt.addr)
			yaml := fmt.Sprintf("  lab: {type: mllp, mllp: {address: \"localhost:%s\"%s}}\n", port, tt.tls)
			res, refused := sendThrough(t, yaml, "127.0.0.2")
			if res.OK || res.Outcome != OutcomeEgress {
				t.Fatalf("result %+v, want outcome %q", res, OutcomeEgress)
			}
			for _, want := range []string{"egress: ", "destination:lab", "127.0.0.1:" + port, "127.0.0.2", "nothing was delivered"} {
				if !strings.Contains(res.Error, want) {
					t.Errorf("error %q does not say %q", res.Error, want)
				}
			}
			if strings.Contains(res.Error, "PID") {
				t.Errorf("error carries message content: %q", res.Error)
			}
			if len(refused) != 1 {
				t.Errorf("%d refusals reported, want 1", len(refused))
			}
			if n := tt.got.Load(); n != 0 {
				t.Fatalf("the partner received %d messages through a refused connection", n)
			}

			res, refused = sendThrough(t, yaml, "127.0.0.1")
			if !res.OK || len(refused) != 0 || tt.got.Load() != 1 {
				t.Fatalf("pinned to its real address: %+v, %d refusals, partner got %d", res, len(refused), tt.got.Load())
			}
		})
	}
}

// The same for an HTTP destination, plain and over TLS.
func TestHTTPDestinationRefusedWhenItsNameMoved(t *testing.T) {
	var got atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	ca := certtest.NewCA(t, "HIE CA")
	srv.TLS = newTLSConfig(ca.Issue(t, "localhost", certtest.Options{}).TLS)
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	yaml := fmt.Sprintf("  lab: {type: http, http: {url: \"https://localhost:%s/hl7\", tls: {ca_file: %q}}}\n",
		port, ca.WriteFile(t, t.TempDir(), "ca.crt"))
	res, refused := sendThrough(t, yaml, "127.0.0.2")
	if res.OK || res.Outcome != OutcomeEgress || len(refused) != 1 || !strings.Contains(res.Error, "destination:lab") {
		t.Fatalf("result %+v, %d refusals; want outcome %q and one refusal", res, len(refused), OutcomeEgress)
	}
	if got.Load() != 0 {
		t.Fatal("the partner got a request through a refused connection")
	}
	if res, _ := sendThrough(t, yaml, "127.0.0.1"); !res.OK || got.Load() != 1 {
		t.Fatalf("pinned to its real address: %+v, partner got %d", res, got.Load())
	}
}

// plainPartner is partner without TLS.
func plainPartner(t *testing.T) (addr string, received *atomic.Int32) {
	t.Helper()
	received = new(atomic.Int32)
	srv := &mllp.Server{Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		received.Add(1)
		m, err := hl7.Parse(raw)
		if err != nil {
			return nil
		}
		return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return ln.Addr().String(), received
}

func newTLSConfig(c tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c}}
}
