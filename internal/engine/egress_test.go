package engine_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// dnsAnswer is what the names the egress policy pins resolve to, as a DNS
// server answers; a test changes it between a node's start and a reload.
type dnsAnswer struct {
	mu   sync.Mutex
	addr netip.Addr
}

func newDNSAnswer(addr string) *dnsAnswer { return &dnsAnswer{addr: netip.MustParseAddr(addr)} }

func (d *dnsAnswer) set(addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addr = netip.MustParseAddr(addr)
}

func (d *dnsAnswer) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return []netip.Addr{d.addr}, nil
}

// egressRefusals is the node's mefor_egress_refused_total for target.
func egressRefusals(t *testing.T, n *engine.Node, target string) float64 {
	t.Helper()
	return value(gatherMetrics(t, n), "mefor_egress_refused_total", "target", target)
}

// A destination listed by name in egress.allow whose name resolves, when a
// delivery connects, to another address than it had when the node loaded
// its config gets nothing: the partner never sees a connection, the
// delivery's last error says egress and names the addresses, the refusal
// is counted and logged (without message content), and the row waits. A
// reload, of the unchanged file, pins the name's address anew, and the
// message is delivered.
func TestEgressRefusesADestinationWhoseAddressChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil) // on 127.0.0.1
	_, port, _ := net.SplitHostPort(p.addr)
	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "egress.yaml", "egress: {allow: [\"localhost:"+port+"\"]}\n"+fixtures.ADTChannel(listen)+`
      - destinations: [downstream]
destinations:
  downstream:
    type: mllp
    mllp: {address: "localhost:`+port+`"}
    retry: {backoff: 100ms, max_backoff: 200ms}
`)
	dns := newDNSAnswer("127.0.0.2") // the answer when the node starts; the system resolves localhost to 127.0.0.1
	var logs fixtures.SyncBuffer
	n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		o.EgressResolver = dns
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})

	if ack := send(t, listen, adt("E1", "DOE^JANE"))[0]; ack.Code != hl7.AckAccept {
		t.Fatalf("intake: %s", ack.Code)
	}
	fixtures.Eventually(t, 20*time.Second, "the refusal to be counted twice (retried)", func() bool {
		return egressRefusals(t, n, "destination:downstream") >= 2
	})
	if got := p.receivedIDs(); len(got) != 0 {
		t.Fatalf("the partner received %v through a refused connection", got)
	}
	var lastError string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM mefor_work WHERE destination = 'downstream'`).Scan(&lastError); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"egress: destination:downstream may not connect to 127.0.0.1:" + port, "127.0.0.2", "mefor reload"} {
		if !strings.Contains(lastError, want) {
			t.Errorf("last_error %q does not say %q", lastError, want)
		}
	}
	log := logs.String()
	if !strings.Contains(log, "egress: connection refused") || !strings.Contains(log, "target=destination:downstream") {
		t.Errorf("the refusal was not logged with its target:\n%s", log)
	}
	if strings.Contains(log, "DOE") {
		t.Errorf("the log holds message content:\n%s", log)
	}

	dns.set("127.0.0.1")
	if _, err := n.Reload(ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	fixtures.Eventually(t, 20*time.Second, "E1 delivered once the reload pinned the new address", func() bool {
		return slices.Contains(p.acceptedIDs(), "E1")
	})
}

// A webhook reaches its receiver through the node's egress policy, over
// TLS verified by the sink's tls: block, with its headers; while the
// receiver's name resolves elsewhere than when the node started, its POSTs
// are refused and counted, and the receiver sees none. A sink whose
// receiver redirects to another host is refused the redirect: the host
// redirected to sees nothing, and the rule's row says why.
func TestWebhookGoesThroughTheEgressPolicy(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	var mu sync.Mutex
	var auth []string
	ca := certtest.NewCA(t, "Hooks CA")
	hooks := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/bounce" {
			http.Redirect(w, r, other.URL+"/hook", http.StatusTemporaryRedirect)
			return
		}
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	hooks.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", certtest.Options{}).TLS}}
	hooks.StartTLS()
	defer hooks.Close()
	_, port, _ := net.SplitHostPort(hooks.Listener.Addr().String())
	caFile := ca.WriteFile(t, t.TempDir(), "ca.crt")

	lab := newPartner(t, "127.0.0.2:0", rejectAll)
	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "hooks.yaml", fmt.Sprintf("egress: {allow: [127.0.0.2, localhost]}\n%s\n"+`
      webhook: {url: "https://localhost:%s/hook", tls: {ca_file: %q}, headers: {Authorization: "Bearer h00k"}}
    bouncer:
      webhook: {url: "https://localhost:%s/bounce", tls: {ca_file: %q}}
  rules:
    - {name: lab-hook, destination: lab, queue_depth: 1, sinks: [hook]}
    - {name: lab-bounce, destination: lab, queue_depth: 1, sinks: [bouncer]}
`, fixtures.ADTChannel(listen)+`
      - destinations: [lab]
destinations:
`+stuckLab(lab.addr)+`alerts:
  interval: 1s
  sinks:
    hook:`, port, caFile, port, caFile))
	dns := newDNSAnswer("127.0.0.2")
	n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		o.EgressResolver = dns
		o.AlertRetryBase = 200 * time.Millisecond
	})
	send(t, listen, adt("W1", "P1"))

	fixtures.Eventually(t, 30*time.Second, "the webhook's POST to be refused", func() bool {
		return egressRefusals(t, n, "alert_sink:hook") >= 1
	})
	mu.Lock()
	got := len(auth)
	mu.Unlock()
	if got != 0 {
		t.Fatalf("the receiver got %d POSTs while its name resolved elsewhere", got)
	}
	// The worker records the failed attempt after the refusal is counted.
	fixtures.Eventually(t, 10*time.Second, "lab-hook's row to say why its POST failed", func() bool {
		return strings.Contains(alertRow(t, db, "lab-hook").LastNotifyError, "egress: alert_sink:hook may not connect to 127.0.0.1:"+port)
	})

	dns.set("127.0.0.1")
	if _, err := n.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 60*time.Second, "the webhook's POST to arrive once the name is pinned to its address", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(auth) > 0
	})
	mu.Lock()
	if auth[0] != "Bearer h00k" {
		t.Errorf("the webhook got Authorization %q, want the configured header", auth[0])
	}
	mu.Unlock()
	fixtures.Eventually(t, 30*time.Second, "the bouncer's redirect to be refused", func() bool {
		return strings.Contains(alertRow(t, db, "lab-bounce").LastNotifyError, "refused a redirect")
	})
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the host redirected to got %d requests", n)
	}
}

// mefor status says where data may go: unrestricted without an egress:
// section, else the list, and warns about outbound plaintext.
func TestStatusShowsEgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	plain := testConfig(t, listen, downstream("127.0.0.1:9"))
	cluster.StartNode(t, db, plain, nil)
	st, err := ops.Status(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Egress.Policies) != 1 || st.Egress.Policies[0].Restricted || len(st.Egress.Policies[0].Plaintext) != 0 {
		t.Fatalf("egress without a list: %+v", st.Egress)
	}

	db2 := testcontainers.NewDB(t)
	listen2 := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "e.yaml", "egress: {allow: [lab.example.org:2575, 127.0.0.1]}\n"+fixtures.ADTChannel(listen2)+`
      - destinations: [lab, local]
destinations:
  lab: {type: mllp, mllp: {address: "lab.example.org:2575"}}
  local: {type: mllp, mllp: {address: "127.0.0.1:9"}}
`)
	cluster.StartNode(t, db2, cfg, nil)
	st, err = ops.Status(ctx, db2.Pool)
	if err != nil {
		t.Fatal(err)
	}
	want := nodeinfo.NodeEgress{Restricted: true, Allow: []string{"lab.example.org:2575", "127.0.0.1"},
		Plaintext: []nodeinfo.PlaintextOutbound{{Target: "destination:lab", Address: "lab.example.org:2575", Protocol: "mllp"}}}
	if len(st.Egress.Policies) != 1 || fmt.Sprint(st.Egress.Policies[0].NodeEgress) != fmt.Sprint(want) {
		t.Fatalf("egress: %+v, want %+v", st.Egress.Policies, want)
	}
}
