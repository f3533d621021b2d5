package engine_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// pki is a CA and the files a TLS node and its partners use.
type pki struct {
	dir                  string
	ca                   *certtest.CA
	caFile               string
	serverCrt, serverKey string
}

func newPKI(t *testing.T) *pki {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "Hospital CA")
	p := &pki{dir: dir, ca: ca, caFile: ca.WriteFile(t, dir, "ca.crt")}
	p.serverCrt, p.serverKey = ca.Issue(t, "mefor.test", certtest.Options{}).WriteFiles(t, dir, "server")
	return p
}

// tlsListenYAML is a config whose channel adt listens with mutual TLS,
// and whose channel open listens with TLS, asking no client certificate,
// on listenOpen (if set).
func (p *pki) tlsListenYAML(listen, listenOpen, partner string) string {
	plain := ""
	if listenOpen != "" {
		plain = fmt.Sprintf(`
  open:
    inbound: {mllp: {listen: %q, tls: {cert_file: %q, key_file: %q}}}
    routes: [{destinations: [down]}]`, listenOpen, p.serverCrt, p.serverKey)
	}
	return fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound:
      mllp:
        listen: %q
        tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
    routes: [{destinations: [down]}]%s
destinations:
  down: {type: mllp, mllp: {address: %q}}
`, listen, p.serverCrt, p.serverKey, p.caFile, plain, partner)
}

// tlsSender is a partner sending to the node with a client certificate,
// noting each connection it makes and the node certificate serial it saw.
type tlsSender struct {
	client *mllp.Client
	conns  atomic.Int32
	serial atomic.Value
}

func newTLSSender(t *testing.T, p *pki, addr string, cert *certtest.Cert) *tlsSender {
	s := &tlsSender{}
	cfg := &tls.Config{RootCAs: p.ca.Pool(), VerifyConnection: func(cs tls.ConnectionState) error {
		s.conns.Add(1)
		s.serial.Store(cs.PeerCertificates[0].SerialNumber.Text(16))
		return nil
	}}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	s.client = &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second, Dialer: mllp.TLSDialer(func() *tls.Config { return cfg })}
	t.Cleanup(func() { s.client.Close() })
	return s
}

func (s *tlsSender) send(t *testing.T, controlID string) hl7.AckCode {
	t.Helper()
	raw, err := s.client.Send(context.Background(), adt(controlID, "P1"))
	if err != nil {
		t.Fatalf("send %s: %v", controlID, err)
	}
	ack, err := hl7.ParseACK(raw)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Code
}

// startTLSNode starts node id on db from a file holding p's
// tlsListenYAML, listening with TLS on a free address it returns, and in
// plaintext on plain when that is not "".
func startTLSNode(t *testing.T, db *testcontainers.DB, p *pki, plain, id string) (*engine.Node, string) {
	t.Helper()
	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "tls.yaml", p.tlsListenYAML(listen, plain, newPartner(t, "", nil).addr))
	return cluster.StartNode(t, db, cfg, named(id)), listen
}

// A partner with a certificate the node's CA signed gets AA, and the
// message records who sent it. Senders the handshake refuses store
// nothing. Status lists the certificates in use and flags the listener
// open to the network that asks for no client certificate.
func TestTLSIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPKI(t)
	_, port, _ := net.SplitHostPort(fixtures.FreeAddr(t))
	n, listen := startTLSNode(t, db, p, "0.0.0.0:"+port, "tls-node")

	partnerA := newTLSSender(t, p, listen, p.ca.Issue(t, "partner-a", certtest.Options{}))
	if code := partnerA.send(t, "T1"); code != hl7.AckAccept {
		t.Fatalf("ack %s, want AA", code)
	}
	var id int64
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM mefor_message WHERE control_id = 'T1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	v, err := ops.ShowMessage(ctx, db.Pool, nil, id, false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Message.SourceIdentity != "CN=partner-a,O=mefor tests" {
		t.Errorf("source identity %q, want the partner's certificate subject", v.Message.SourceIdentity)
	}

	stranger := certtest.NewCA(t, "Someone else").Issue(t, "stranger", certtest.Options{})
	for name, c := range map[string]*mllp.Client{
		"no certificate": {Addr: listen, Dialer: mllp.TLSDialer(func() *tls.Config { return &tls.Config{RootCAs: p.ca.Pool()} })},
		"other CA": {Addr: listen, Dialer: mllp.TLSDialer(func() *tls.Config {
			return &tls.Config{RootCAs: p.ca.Pool(),
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stranger.TLS, nil }}
		})},
		"plaintext": {Addr: listen},
	} {
		if _, err := c.Send(ctx, adt("REFUSED", "P1")); err == nil {
			t.Errorf("%s: accepted", name)
		}
		c.Close()
	}
	if got := queryInt(t, db, `SELECT count(*) FROM mefor_message`); got != 1 {
		t.Fatalf("%d messages stored, want only the one from the verified partner", got)
	}

	st, err := ops.Status(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, c := range st.Transport.Certificates {
		if slices.Contains(c.Nodes, "tls-node") {
			listed = append(listed, filepath.Base(c.File)+" "+c.Subject)
		}
		if c.NotAfter.IsZero() {
			t.Errorf("%s listed without its expiry", c.File)
		}
	}
	slices.Sort(listed)
	if want := []string{"ca.crt CN=Hospital CA,O=mefor tests", "server.crt CN=mefor.test,O=mefor tests"}; !slices.Equal(listed, want) {
		t.Errorf("status lists certificates %v, want %v", listed, want)
	}
	flagged := map[string]bool{}
	for _, l := range st.Transport.Listeners {
		flagged[l.Channel] = l.Flagged
	}
	if len(flagged) != 2 || flagged["adt"] || !flagged["open"] {
		t.Errorf("listeners flagged %v, want only the one on 0.0.0.0 that asks for no client certificate", flagged)
	}
	_ = n
}

// A node does not start with an expired certificate, and says which.
func TestExpiredCertificateRefusedAtStart(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPKI(t)
	p.ca.Issue(t, "mefor.test", certtest.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}).
		WriteFiles(t, p.dir, "server")
	_, cfg := configFile(t, "tls.yaml", p.tlsListenYAML(fixtures.FreeAddr(t), "", "127.0.0.1:9"))
	_, err := engine.New(engine.Options{Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "expired"})
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("New = %v, want the start refused with config errors", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, p.serverCrt) || !strings.Contains(msg, "inbound.mllp.tls.cert_file") || !strings.Contains(msg, "expired") {
		t.Errorf("error does not name the expired certificate's file and field:\n%s", msg)
	}
}

// A reload picks up a renewed certificate at the same path: a partner
// connected before keeps its connection and goes on sending, a partner
// connecting after gets the renewed certificate.
func TestReloadRenewsCertificateKeepingConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPKI(t)
	n, listen := startTLSNode(t, db, p, "", "renew")

	client := p.ca.Issue(t, "partner-a", certtest.Options{})
	early := newTLSSender(t, p, listen, client)
	if code := early.send(t, "R1"); code != hl7.AckAccept {
		t.Fatalf("ack %s", code)
	}
	oldSerial := early.serial.Load().(string)

	renewed := p.ca.Issue(t, "mefor.test", certtest.Options{NotAfter: time.Now().Add(3 * time.Hour)})
	renewed.WriteFiles(t, p.dir, "server")
	res, err := n.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Renewed, p.serverCrt) || len(res.Listeners) != 0 {
		t.Errorf("reload: renewed %v, listeners %v; want the certificate renewed and no listener rebound", res.Renewed, res.Listeners)
	}

	if code := early.send(t, "R2"); code != hl7.AckAccept {
		t.Fatalf("ack %s on the connection made before the renewal", code)
	}
	if c := early.conns.Load(); c != 1 {
		t.Fatalf("the early partner connected %d times, want its first connection kept", c)
	}
	late := newTLSSender(t, p, listen, client)
	if code := late.send(t, "R3"); code != hl7.AckAccept {
		t.Fatalf("ack %s", code)
	}
	if got, want := late.serial.Load().(string), renewed.Leaf.SerialNumber.Text(16); got != want || got == oldSerial {
		t.Fatalf("a new connection got certificate %s, want the renewed %s (old %s)", got, want, oldSerial)
	}
	if !slices.ContainsFunc(n.Certificates(), func(c tlsconf.Certificate) bool { return c.Serial == renewed.Leaf.SerialNumber.Text(16) }) {
		t.Error("the node does not list the renewed certificate")
	}
}

// A partner whose certificate does not verify is sent nothing; each
// attempt is recorded as outcome tls with the reason, and the lane retries.
// Once the right CA is installed and reloaded, the message goes through.
func TestOutboundTLSFailureRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	labCA, wrongCA := certtest.NewCA(t, "Lab CA"), certtest.NewCA(t, "Wrong CA")
	dir := t.TempDir()
	caFile := wrongCA.WriteFile(t, dir, "lab-ca.crt")

	var received atomic.Int32
	srv := &mllp.Server{
		Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
			received.Add(1)
			m, _ := hl7.Parse(raw)
			return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{labCA.Issue(t, "lab", certtest.Options{}).TLS}},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	_, cfg := configFile(t, "out.yaml", fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [lab]}]
destinations:
  lab:
    type: mllp
    mllp: {address: %q, tls: {ca_file: %q, server_name: localhost}}
    retry: {backoff: 200ms, max_backoff: 200ms}
`, fixtures.FreeAddr(t), ln.Addr().String(), caFile))
	n := cluster.StartNode(t, db, cfg, named("out"))
	receive(t, n, "O1")

	var attempts int
	var lastErr string
	fixtures.Eventually(t, 30*time.Second, "two failed attempts", func() bool {
		err := db.Pool.QueryRow(ctx, `SELECT attempts, coalesce(last_error, '') FROM mefor_work WHERE stage = 'outbound'`).Scan(&attempts, &lastErr)
		return err == nil && attempts >= 2
	})
	if !strings.HasPrefix(lastErr, "tls: ") || !strings.Contains(lastErr, mllp.ReasonUnknownAuthority) {
		t.Errorf("last_error %q, want outcome tls with the reason", lastErr)
	}
	outcomes := queryStrings(t, db, `SELECT outcome FROM mefor_response ORDER BY id`)
	if len(outcomes) < 2 || slices.ContainsFunc(outcomes, func(o string) bool { return o != "tls" }) {
		t.Errorf("attempt outcomes %v, want tls each time", outcomes)
	}
	if got := received.Load(); got != 0 {
		t.Fatalf("the partner whose certificate did not verify received %d messages", got)
	}

	labCA.WriteFile(t, dir, "lab-ca.crt")
	if _, err := n.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the message delivered once the right CA is installed", func() bool {
		return received.Load() == 1
	})
}

// Acknowledging a plaintext listener (plaintext: true) silences a warning
// and nothing else: the listener, and connections on it, stay up.
func TestReloadPlaintextAcknowledgementKeepsListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	doc := func(extra string) string {
		return adtToDown(listen, extra, newPartner(t, "", nil).addr, "")
	}
	path, cfg := configFile(t, "plain.yaml", doc(""))
	n := cluster.StartNode(t, db, cfg, named("plain"))

	var conns atomic.Int32
	c := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer c.Close()
	if _, err := c.Send(ctx, adt("P1", "X")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, doc(", plaintext: true"))
	res, err := n.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || len(res.Listeners) != 0 {
		t.Errorf("reload: changed %v, listeners %v; want the file applied and no listener rebound", res.Changed, res.Listeners)
	}
	if _, err := c.Send(ctx, adt("P2", "X")); err != nil {
		t.Fatal(err)
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("the sender connected %d times, want its connection kept across the reload", got)
	}
}
