package engine_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// nodeMetric is the value of a counter or gauge of the node's registry
// with exactly labels ("k", "v" pairs), 0 when it has no such sample.
func nodeMetric(t *testing.T, n *engine.Node, name string, labels ...string) float64 {
	t.Helper()
	m, ok := sample(gatherMetrics(t, n), name, labels...)
	switch {
	case !ok:
		return 0
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func refused(t *testing.T, n *engine.Node, reason string) float64 {
	t.Helper()
	return nodeMetric(t, n, "mefor_connections_refused_total", "channel", "adt", "reason", reason)
}

// clientFrom is an MLLP client whose connections come from the loopback
// address from (all of 127/8 is loopback on Linux).
func clientFrom(from, addr string) *mllp.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	return &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second, Dialer: d.DialContext}
}

// sendFrom sends one message from the address from, on a connection of
// its own, and returns the ACK code or the error.
func sendFrom(from, addr, controlID string) (hl7.AckCode, error) {
	c := clientFrom(from, addr)
	defer c.Close()
	raw, err := c.Send(context.Background(), adt(controlID, "P1"))
	if err != nil {
		return "", err
	}
	ack, err := hl7.ParseACK(raw)
	if err != nil {
		return "", err
	}
	return ack.Code, nil
}

// watchedNode starts a node on cfg whose log is watched for the given
// texts.
func watchedNode(t *testing.T, db *testcontainers.DB, cfg *config.Config, id string, watch ...string) (*engine.Node, *logWatch) {
	t.Helper()
	w := newLogWatch(fixtures.Logger(t).Handler(), watch...)
	n := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = id; o.Logger = slog.New(w) })
	return n, w
}

// A connection from a source outside the listener's allow list is closed
// before anything is read: the sender gets no ACK and nothing is stored.
// Each refusal is counted; the source is logged once, however often it
// retries. A reload that narrows the list closes the connections already
// open from a source it no longer allows.
func TestAllowListRefusesOtherSources(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	doc := func(allow string) string {
		return adtToDown(listen, ", allow: ["+allow+"]", newPartner(t, "", nil).addr, "")
	}
	path, cfg := configFile(t, "allow.yaml", doc("127.0.0.1, 10.0.0.0/8"))
	n, logs := watchedNode(t, db, cfg, "allow", "connection refused")

	for i := range 3 {
		if code, err := sendFrom("127.0.0.2", listen, fmt.Sprintf("X%d", i)); err == nil {
			t.Fatalf("a sender from 127.0.0.2 got %s", code)
		}
	}
	if got := refused(t, n, "not_allowed"); got != 3 {
		t.Errorf("mefor_connections_refused_total{reason=not_allowed} = %v, want 3", got)
	}
	if got := logs.count("connection refused"); got != 1 {
		t.Errorf("three refusals of one source logged %d times, want once", got)
	}
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_message`); got != 0 {
		t.Fatalf("%d messages stored from a source not allowed", got)
	}

	kept := clientFrom("127.0.0.1", listen)
	defer kept.Close()
	if _, err := kept.Send(context.Background(), adt("A1", "P1")); err != nil {
		t.Fatalf("the allowed sender: %v", err)
	}
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_message`); got != 1 {
		t.Fatalf("%d messages stored, want the allowed sender's one", got)
	}

	writeFile(t, path, doc("127.0.0.2"))
	res, err := n.Reload(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Listeners, []string{"adt"}) {
		t.Errorf("reload rebound %v, want adt", res.Listeners)
	}
	if _, err := kept.Send(context.Background(), adt("A2", "P1")); err == nil {
		t.Fatal("127.0.0.1, no longer allowed, still sends on the connection it opened before the reload")
	}
	if code, err := sendFrom("127.0.0.2", listen, "B1"); err != nil || code != hl7.AckAccept {
		t.Fatalf("127.0.0.2, now allowed: %s %v", code, err)
	}
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_message`); got != 2 {
		t.Fatalf("%d messages stored, want A1 and B1", got)
	}
}

// dialIdle opens a connection from the address from and leaves it idle.
func dialIdle(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedAtOnce reports whether the node closed c without waiting for it
// to send anything.
func closedAtOnce(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// Over max_connections_per_ip, a source's next connection is closed at
// once; over max_connections, any source's is. Both are counted, nothing
// is stored from them, and a closed connection frees its place.
func TestConnectionCaps(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "caps.yaml", adtToDown(listen, ", max_connections: 3, max_connections_per_ip: 2", newPartner(t, "", nil).addr, ""))
	n := cluster.StartNode(t, db, cfg, named("caps"))
	open := func() float64 { return nodeMetric(t, n, "mefor_connections_open", "channel", "adt") }

	first := dialIdle(t, "127.0.0.2", listen)
	dialIdle(t, "127.0.0.2", listen)
	fixtures.Eventually(t, 10*time.Second, "two connections held", func() bool { return open() == 2 })
	if !closedAtOnce(dialIdle(t, "127.0.0.2", listen)) {
		t.Fatal("a third connection from 127.0.0.2 was held")
	}
	if code, err := sendFrom("127.0.0.3", listen, "C1"); err != nil || code != hl7.AckAccept {
		t.Fatalf("another source under the caps: %s %v", code, err)
	}
	fixtures.Eventually(t, 10*time.Second, "C1's connection closed", func() bool { return open() == 2 })
	dialIdle(t, "127.0.0.3", listen)
	fixtures.Eventually(t, 10*time.Second, "three connections held", func() bool { return open() == 3 })
	if code, err := sendFrom("127.0.0.4", listen, "C2"); err == nil {
		t.Fatalf("a fourth connection got %s", code)
	}
	if per, all := refused(t, n, "max_connections_per_ip"), refused(t, n, "max_connections"); per != 1 || all != 1 {
		t.Errorf("refused max_connections_per_ip %v, max_connections %v; want 1 each", per, all)
	}
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_message`); got != 1 {
		t.Fatalf("%d messages stored, want C1 only", got)
	}

	first.Close()
	fixtures.Eventually(t, 10*time.Second, "the closed connection's place freed", func() bool { return open() == 2 })
	if code, err := sendFrom("127.0.0.4", listen, "C3"); err != nil || code != hl7.AckAccept {
		t.Fatalf("after a connection closed: %s %v", code, err)
	}
}

// A reload that makes a plaintext listener reachable from the network,
// without plaintext: true, is refused naming the file, line and fix; the
// node keeps listening as before.
func TestReloadRefusesExposedPlaintext(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	_, port, _ := net.SplitHostPort(listen)
	doc := func(addr string) string {
		return adtToDown(addr, "", newPartner(t, "", nil).addr, "")
	}
	path, cfg := configFile(t, "plain.yaml", doc(listen))
	n := cluster.StartNode(t, db, cfg, named("exposed"))
	writeFile(t, path, doc("0.0.0.0:"+port))
	_, err := n.Reload(context.Background())
	if err == nil || !strings.Contains(err.Error(), path+":4:") || !strings.Contains(err.Error(), "would accept plaintext MLLP from the network") ||
		!strings.Contains(err.Error(), "plaintext: true") {
		t.Fatalf("reload = %v, want it refused naming %s:4 and the fix", err, path)
	}
	if code, err := sendFrom("127.0.0.1", listen, "P1"); err != nil || code != hl7.AckAccept {
		t.Fatalf("after the refused reload: %s %v", code, err)
	}
}

// A TLS listener with allow_names and crl_file, certificates made with
// openssl: a certificate from the trusted CA is let in only when its
// common name, DNS name or URI is allowed, and not once it is revoked. A
// revocation applies at the next mefor reload, to the revoked partner's
// open connection too; the others' carry on through a new listener.
func TestAllowNamesAndRevocation(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ca := certtest.NewOpenSSLCA(t, "Partners CA")
	server := ca.Issue(t, "server", "mefor.test", "DNS:localhost", "IP:127.0.0.1")
	lab := ca.Issue(t, "lab", "lab-1", "DNS:lab.example.org")
	lab2 := ca.Issue(t, "lab2", "lab-2", "DNS:lab.example.org")
	registration := ca.Issue(t, "registration", "reg", "URI:spiffe://hospital/registration")
	byCN := ca.Issue(t, "adt-feed", "adt-feed")
	stranger := ca.Issue(t, "stranger", "stranger", "DNS:stranger.example.org")
	crl := ca.GenCRL(t)

	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "names.yaml", fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound:
      mllp:
        listen: %q
        tls:
          cert_file: %q
          key_file: %q
          client_ca_file: %q
          allow_names: [lab.example.org, "spiffe://hospital/registration", adt-feed]
          crl_file: %q
    routes: [{destinations: [down]}]
destinations:
  down: {type: mllp, mllp: {address: %q}}
`, listen, server.CertFile, server.KeyFile, ca.CertFile, crl, newPartner(t, "", nil).addr))
	n, logs := watchedNode(t, db, cfg, "names", "connection refused")

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(mustRead(t, ca.CertFile))
	client := func(c *certtest.FileCert) *mllp.Client {
		tc := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{c.TLS}}
		cl := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second, Dialer: mllp.TLSDialer(func() *tls.Config { return tc })}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	sendWith := func(cl *mllp.Client, id string) error {
		raw, err := cl.Send(context.Background(), adt(id, "P1"))
		if err != nil {
			return err
		}
		if ack, err := hl7.ParseACK(raw); err != nil || ack.Code != hl7.AckAccept {
			return fmt.Errorf("ack %v %v", ack.Code, err)
		}
		return nil
	}

	for id, c := range map[string]*certtest.FileCert{"N1": lab, "N2": registration, "N3": byCN} {
		if err := sendWith(client(c), id); err != nil {
			t.Fatalf("%s (%s) refused: %v", id, c.Leaf.Subject, err)
		}
	}
	lab2Client := client(lab2)
	if err := sendWith(lab2Client, "N4"); err != nil {
		t.Fatalf("lab-2 before its revocation: %v", err)
	}
	if err := sendWith(client(stranger), "S1"); err == nil {
		t.Fatal("a certificate of the trusted CA with no allowed name was let in")
	}
	fixtures.Eventually(t, 10*time.Second, "the name refusal counted", func() bool { return refused(t, n, "tls_name") == 1 })

	ca.Revoke(t, lab2)
	ca.GenCRL(t)
	res, err := n.Reload(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Renewed, crl) || !slices.Equal(res.Listeners, []string{"adt"}) {
		t.Errorf("reload renewed %v and rebound %v; want the CRL renewed and adt rebound", res.Renewed, res.Listeners)
	}
	if err := sendWith(lab2Client, "R1"); err == nil {
		t.Fatal("the revoked certificate's connection from before the reload still sends")
	}
	if err := sendWith(client(lab2), "R2"); err == nil {
		t.Fatal("a revoked certificate was let in")
	}
	fixtures.Eventually(t, 10*time.Second, "the revocations counted", func() bool { return refused(t, n, "tls_revoked") >= 1 })
	if err := sendWith(client(lab), "N5"); err != nil {
		t.Fatalf("lab-1, not revoked, after the reload: %v", err)
	}

	stored := queryStrings(t, db, `SELECT control_id FROM mefor_message ORDER BY control_id`)
	if want := []string{"N1", "N2", "N3", "N4", "N5"}; !slices.Equal(stored, want) {
		t.Errorf("stored %v, want %v", stored, want)
	}
	if got := refused(t, n, "tls_handshake"); got != 0 {
		t.Errorf("%v refusals counted as tls_handshake, want each under its own reason", got)
	}
	if got := logs.count("connection refused"); got < 1 {
		t.Error("no refusal logged")
	}
	var listed bool
	for _, c := range n.Certificates() {
		listed = listed || (c.CRL && c.File == crl)
	}
	if !listed {
		t.Error("the node does not list the revocation list it uses")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
