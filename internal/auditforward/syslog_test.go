package auditforward_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/testcontainers"
)

// rsyslogImage is Debian's rsyslog with its GnuTLS network stream driver,
// built locally by testcontainers/peerimage/build.sh.
const rsyslogImage = "mefor-rsyslog:1"

var rsyslogPackages = []string{"rsyslog", "rsyslog-gnutls"}

// receivedFile is where the receiver writes each message it read, as
// received, one a line.
const receivedFile = "/var/log/mefor/received.log"

// startRsyslog runs rsyslog with its TLS input (imtcp, gtls driver,
// StreamDriver.Mode=1): with requireClient, it requires a client
// certificate signed by ca and naming mefor.test (AuthMode x509/name);
// without, it takes any client (anon).
func startRsyslog(t *testing.T, ca *certtest.OpenSSLCA, requireClient bool) *testcontainers.Peer {
	t.Helper()
	server := ca.Issue(t, "rsyslog", "rsyslog.test", "DNS:rsyslog.test", "IP:127.0.0.1")
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	auth := `StreamDriver.AuthMode="anon"`
	if requireClient {
		auth = `StreamDriver.AuthMode="x509/name" PermittedPeer=["mefor.test"]`
	}
	return testcontainers.StartPeer(t, testcontainers.PeerOptions{
		Image: rsyslogImage, Packages: rsyslogPackages, Port: 6514,
		WaitFor: "rsyslogd",
		Setup: func(port int) ([]string, map[string][]byte) {
			conf := fmt.Sprintf(`global(
	DefaultNetstreamDriver="gtls"
	DefaultNetstreamDriverCAFile="/etc/mefor-tls/ca.crt"
	DefaultNetstreamDriverCertFile="/etc/mefor-tls/server.crt"
	DefaultNetstreamDriverKeyFile="/etc/mefor-tls/server.key"
	workDirectory="/tmp"
	maxMessageSize="64k"
)
module(load="imtcp" StreamDriver.Name="gtls" StreamDriver.Mode="1" %s)
input(type="imtcp" port="%d" address="127.0.0.1")
template(name="raw" type="string" string="%%rawmsg%%\n")
action(type="omfile" file="%s" template="raw" dirCreateMode="0755" flushOnTXEnd="on" asyncWriting="off")
`, auth, port, receivedFile)
			return []string{"rsyslogd", "-n", "-f", "/etc/mefor-rsyslog.conf", "-i", "/tmp/rsyslogd.pid"},
				map[string][]byte{
					"/etc/mefor-rsyslog.conf":   []byte(conf),
					"/etc/mefor-tls/ca.crt":     read(ca.CertFile),
					"/etc/mefor-tls/server.crt": read(server.CertFile),
					"/etc/mefor-tls/server.key": read(server.KeyFile),
				}
		},
	})
}

func trust(t *testing.T, ca *certtest.OpenSSLCA) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("CA does not load")
	}
	return pool
}

var (
	rowSD    = regexp.MustCompile(`^<(\d+)>1 \S+ \S+ mefor - audit \[mefor@32473 seq="(\d+)" action="([^"]*)"`)
	anchorSD = regexp.MustCompile(`^<\d+>1 \S+ \S+ mefor - anchor \[mefor@32473 anchor="(\d+)" seq="(\d+)"`)
)

// received reads what the receiver wrote: the audit rows' seqs and the
// anchors' numbers, each in the order they arrived.
func received(t *testing.T, p *testcontainers.Peer) (seqs, anchors []int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data, err := p.ReadFile(ctx, receivedFile)
	if err != nil {
		if strings.Contains(err.Error(), "No such file") || strings.Contains(strings.ToLower(err.Error()), "not find") || strings.Contains(err.Error(), "not found") {
			return nil, nil
		}
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if m := rowSD.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			seqs = append(seqs, n)
		} else if m := anchorSD.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			anchors = append(anchors, n)
		} else if strings.TrimSpace(line) != "" {
			t.Errorf("the receiver got a line that is no audit message: %.200q", line)
		}
	}
	return seqs, anchors
}

func appendRows(t *testing.T, db *testcontainers.DB, n int) {
	t.Helper()
	for range n {
		if err := audit.AppendAlone(context.Background(), db.Pool, audit.Entry{Action: audit.ActionReplay,
			Target: map[string]any{"message_id": 42}}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitReceived waits until the receiver wrote n rows.
func waitReceived(t *testing.T, p *testcontainers.Peer, n int) (seqs, anchors []int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		seqs, anchors = received(t, p)
		if len(seqs) >= n || time.Now().After(deadline) {
			return seqs, anchors
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkNoGap fails unless seqs holds every row from 1 to last, in order;
// a row may come again after a restart (at least once), but never before
// a row after it was first seen.
func checkNoGap(t *testing.T, seqs []int64, last int64) {
	t.Helper()
	var max int64
	for i, s := range seqs {
		switch {
		case s > max+1:
			t.Fatalf("row %d arrived right after row %d (message %d of %d): rows %d to %d are missing", s, max, i+1, len(seqs), max+1, s-1)
		case s == max+1:
			max = s
		}
	}
	if max != last {
		t.Fatalf("the receiver has rows up to %d, want %d (got %v)", max, last, seqs)
	}
}

// Every audit row and anchor reaches a real syslog receiver (Debian's
// rsyslog, TLS input) in order, once each while it stays up; after the
// receiver was stopped and rows were appended meanwhile, everything
// arrives once it is back, with no gap and in order.
func TestForwardToRsyslogResumesAfterRestartWithoutGap(t *testing.T) {
	t.Parallel()
	// A forwarder that never advanced its cursor would send the first
	// batch forever: the deadline turns that into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testcontainers.NewDB(t)
	ca := certtest.NewOpenSSLCA(t, "syslog-ca")
	client := ca.Issue(t, "mefor-client", "mefor.test", "DNS:mefor.test")
	rs := startRsyslog(t, ca, true)

	appendRows(t, db, 5)
	if _, _, err := audit.TakeAnchor(ctx, db.Pool, nil, "node-a"); err != nil {
		t.Fatal(err)
	}
	appendRows(t, db, 3)

	sender := &auditforward.Syslog{Address: rs.Addr, Hostname: "node-a", Timeout: 10 * time.Second,
		TLS: &tls.Config{RootCAs: trust(t, ca), ServerName: "rsyslog.test", MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{client.TLS}}}
	f := &auditforward.Forwarder{DB: db.Pool, Target: auditforward.TargetSyslog, Sender: sender, Batch: 4,
		RetryMin: 100 * time.Millisecond, RetryMax: 500 * time.Millisecond, RetryFor: 20 * time.Second}
	res, err := f.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 8 || res.Anchors != 1 || res.Cursor.Seq != 8 || res.Cursor.AnchorNo != 1 {
		t.Fatalf("first run: %+v, want 8 rows and 1 anchor sent, cursor at 8 and anchor 1", res)
	}
	seqs, anchors := waitReceived(t, rs, 8)
	if want := []int64{1, 2, 3, 4, 5, 6, 7, 8}; fmt.Sprint(seqs) != fmt.Sprint(want) {
		t.Fatalf("the receiver got rows %v, want %v once each in order", seqs, want)
	}
	if fmt.Sprint(anchors) != "[1]" {
		t.Fatalf("the receiver got anchors %v, want [1]", anchors)
	}

	// A client the receiver refuses (its certificate names another peer)
	// is not taken as accepted though the receiver closes the connection:
	// it closes with the messages unread, which resets it. Under TLS 1.3
	// the refusal comes after the client's handshake, so the reset can
	// also meet the write itself ("broken pipe"): either way the batch is
	// not accepted.
	intruder := ca.Issue(t, "intruder", "intruder.test", "DNS:intruder.test")
	refused := &auditforward.Forwarder{DB: db.Pool, Target: "intruder", RetryMin: 100 * time.Millisecond, RetryFor: time.Second,
		Sender: &auditforward.Syslog{Address: rs.Addr, Hostname: "node-a", Timeout: 5 * time.Second,
			TLS: &tls.Config{RootCAs: trust(t, ca), ServerName: "rsyslog.test", Certificates: []tls.Certificate{intruder.TLS}}}}
	if res, err := refused.Run(ctx); err == nil || res.Cursor.Seq != 0 || !(strings.Contains(err.Error(), "did not confirm reading") || strings.Contains(err.Error(), "write 9 messages")) {
		t.Fatalf("a client the receiver refused: %+v, %v; want the batch not confirmed and its cursor at row 0", res, err)
	}
	if seqs, _ := received(t, rs); len(seqs) != 8 {
		t.Fatalf("the receiver logged %v after refusing a client, want rows 1 to 8 only", seqs)
	}

	// A run with nothing new sends nothing again.
	if res, err := f.Run(ctx); err != nil || res.Rows+res.Anchors != 0 {
		t.Fatalf("a run with nothing new: %+v, %v; want nothing sent", res, err)
	}

	// The receiver goes away; rows keep coming.
	stop := 2 * time.Second
	if err := rs.Container.Stop(ctx, &stop); err != nil {
		t.Fatal(err)
	}
	appendRows(t, db, 6)
	if _, _, err := audit.TakeAnchor(ctx, db.Pool, nil, "node-a"); err != nil {
		t.Fatal(err)
	}
	appendRows(t, db, 4)
	f.RetryFor = 2 * time.Second
	if _, err := f.Run(ctx); err == nil {
		t.Fatal("forwarding to a stopped receiver reported success")
	}
	cur, err := auditforward.ReadCursor(ctx, db.Pool, auditforward.TargetSyslog)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Seq != 8 || cur.LastError == "" || cur.FailedAt == nil {
		t.Errorf("after failing: cursor %+v, want it still at row 8 with the failure recorded", cur)
	}

	if err := rs.Container.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The receiver needs a moment to listen again: the forwarder retries.
	f.RetryFor = 30 * time.Second
	res, err = f.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Cursor.Seq != 18 || res.Cursor.AnchorNo != 2 {
		t.Fatalf("after the restart: %+v, want the cursor at row 18 and anchor 2", res)
	}
	seqs, anchors = waitReceived(t, rs, 18)
	checkNoGap(t, seqs, 18)
	if len(seqs) != 18 {
		t.Errorf("the receiver got %d row messages for 18 rows: %v", len(seqs), seqs)
	}
	if fmt.Sprint(anchors) != "[1 2]" {
		t.Errorf("the receiver got anchors %v, want [1 2]", anchors)
	}
	cur, err = auditforward.ReadCursor(ctx, db.Pool, auditforward.TargetSyslog)
	if err != nil {
		t.Fatal(err)
	}
	if cur.LastError != "" || cur.SentAt == nil {
		t.Errorf("after catching up: cursor %+v, want the failure cleared", cur)
	}
}

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
