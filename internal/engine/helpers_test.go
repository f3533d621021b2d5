package engine_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// partner is a fake downstream system that speaks real MLLP and answers
// real ACKs. fail decides, per received message, which code to answer.
type partner struct {
	t    testing.TB
	addr string
	srv  *mllp.Server

	mu       sync.Mutex
	received []string // MSH-10 of every message, in arrival order, including failed ones
	accepted []string // MSH-10 of messages answered AA
	fail     func(controlID string, n int) hl7.AckCode
}

func newPartner(t testing.TB, addr string) *partner {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	p := &partner{t: t}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("partner listen: %v", err)
	}
	p.addr = ln.Addr().String()
	p.srv = &mllp.Server{Handler: mllp.HandlerFunc(p.serve)}
	go p.srv.Serve(ln)
	t.Cleanup(p.stop)
	return p
}

func (p *partner) serve(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
	msg, err := hl7.Parse(raw)
	if err != nil {
		return hl7.NewACKForUnparsed(raw, hl7.AckReject, "unparseable", hl7.NewControlID(), time.Now())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id := msg.ControlID()
	p.received = append(p.received, id)
	code := hl7.AckAccept
	if p.fail != nil {
		code = p.fail(id, len(p.received))
	}
	if code == hl7.AckAccept {
		p.accepted = append(p.accepted, id)
	}
	return hl7.NewACK(msg, code, "", hl7.NewControlID(), time.Now())
}

func (p *partner) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

func (p *partner) acceptedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.accepted...)
}

func (p *partner) receivedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.received...)
}

// downAddr returns an address for a partner that is down (connections are
// refused) until the test starts one on it. It is on 127.0.0.2, where no
// other listener of the test binary binds: on 127.0.0.1 the kernel may give
// a closed port to another test's partner listening on port 0, which would
// then receive this test's deliveries.
func downAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("reserve a port on 127.0.0.2: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// adt builds a small ADT^A01 with the given control id and patient id.
func adt(controlID, patient string) []byte {
	return []byte("MSH|^~\\&|REG|HOSP|MEFOR|MEFOR|20240102081500||ADT^A01^ADT_A01|" + controlID + "|P|2.5.1\r" +
		"EVN|A01|20240102081500\r" +
		"PID|1||" + patient + "^^^HOSP^MR||DOE^JANE||19800101|F\r" +
		"PV1|1|I|3N^301^A\r")
}

// testConfig is a one-channel config delivering ADT to the given
// destinations YAML.
func testConfig(t testing.TB, listen, destinations string) *config.Config {
	t.Helper()
	y := fixtures.ADTChannel(listen) + fmt.Sprintf(`
      - name: out
        match: {message_type: [ADT]}
        destinations: [%s]
destinations:
%s`, destNames(destinations), destinations)
	cfg, err := config.Parse("test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatalf("test config: %v\n%s", err, y)
	}
	return cfg
}

// downstream is the destinations block of testConfig for one MLLP
// destination "downstream" at addr, with more lines of its block (retry,
// ordering, record_batch...) each as one string.
func downstream(addr string, more ...string) string {
	b := fmt.Sprintf("  downstream:\n    type: mllp\n    mllp: {address: \"%s\"}\n", addr)
	for _, l := range more {
		b += "    " + l + "\n"
	}
	return b
}

// destNames pulls the top-level destination names out of a destinations block.
func destNames(block string) string {
	var names []string
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") && strings.HasSuffix(strings.TrimSpace(line), ":") {
			names = append(names, strings.TrimSuffix(strings.TrimSpace(line), ":"))
		}
	}
	return strings.Join(names, ", ")
}

// startTracedNode starts a node on db whose sessions report every
// statement to tracer, its drainers lingering for linger, with one channel
// delivering to a fresh partner. It returns the channel's listen address
// and the partner.
func startTracedNode(t *testing.T, db *testcontainers.DB, tracer pgx.QueryTracer, linger time.Duration) (string, *partner) {
	t.Helper()
	pool := db.TracedPool(t, tracer) // closed after the node's stop, registered below
	p := newPartner(t, "")
	listen := fixtures.FreeAddr(t)
	cluster.StartNode(t, db, testConfig(t, listen, downstream(p.addr)), func(o *engine.Options) {
		o.Pool = pool
		o.Limits.Linger = linger
	})
	return listen, p
}

// send sends each message to addr over one MLLP connection and returns the ACKs.
func send(t *testing.T, addr string, msgs ...[]byte) []hl7.Ack {
	t.Helper()
	c := &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second}
	defer c.Close()
	var acks []hl7.Ack
	for i, m := range msgs {
		raw, err := c.Send(context.Background(), m)
		if err != nil {
			t.Fatalf("send message %d: %v", i, err)
		}
		ack, err := hl7.ParseACK(raw)
		if err != nil {
			t.Fatalf("ack of message %d: %v", i, err)
		}
		acks = append(acks, ack)
	}
	return acks
}
