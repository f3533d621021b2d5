package engine_test

import (
	"context"
	"errors"
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

// hang, as a partner's answer, sends no ACK: the partner holds the message
// until the sender gives up and closes the connection.
const hang hl7.AckCode = ""

// answerFunc decides a partner's answer to one message from its control id
// and how many times that id has been received so far (1 on first
// receipt). It may block until ctx ends.
type answerFunc func(ctx context.Context, id string, n int) hl7.AckCode

// receipt is one message as a partner received it.
type receipt struct {
	id     string // MSH-10
	remote string // the sender's address: one per connection
	raw    []byte
}

// partner is a fake downstream system that speaks real MLLP and answers
// real ACKs, each decided by the test's answerFunc, called outside the
// partner's lock.
type partner struct {
	addr string
	srv  *mllp.Server

	mu       sync.Mutex
	received []receipt // in arrival order, failed ones included
	accepted []string  // MSH-10 of messages answered AA
	seen     map[string]int
	answer   answerFunc
}

// newPartner listens on addr ("" for any free port) until the test ends.
// A nil answer accepts everything.
func newPartner(t testing.TB, addr string, answer answerFunc) *partner {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	p := &partner{seen: map[string]int{}, answer: answer}
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

func (p *partner) serve(ctx context.Context, raw []byte, conn mllp.ConnInfo) []byte {
	msg, err := hl7.Parse(raw)
	if err != nil {
		return hl7.NewACKForUnparsed(raw, hl7.AckReject, "unparseable", hl7.NewControlID(), time.Now())
	}
	id := msg.ControlID()
	remote := ""
	if conn.RemoteAddr != nil {
		remote = conn.RemoteAddr.String()
	}
	p.mu.Lock()
	p.received = append(p.received, receipt{id: id, remote: remote, raw: raw})
	p.seen[id]++
	n := p.seen[id]
	answer := p.answer
	p.mu.Unlock()

	code := hl7.AckAccept
	if answer != nil {
		code = answer(ctx, id, n)
	}
	if code == hang {
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
		}
		return nil
	}
	if code == hl7.AckAccept {
		p.mu.Lock()
		p.accepted = append(p.accepted, id)
		p.mu.Unlock()
	}
	return hl7.NewACK(msg, code, "test partner says "+string(code), hl7.NewControlID(), time.Now())
}

func (p *partner) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

// setAnswer replaces the answer function for messages received from now on.
func (p *partner) setAnswer(answer answerFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer = answer
}

func (p *partner) receivedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.received))
	for i, r := range p.received {
		out[i] = r.id
	}
	return out
}

func (p *partner) acceptedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.accepted...)
}

// connections returns how many distinct connections delivered messages.
func (p *partner) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range p.received {
		seen[r.remote] = true
	}
	return len(seen)
}

// messages returns what the partner received, parsed, in arrival order.
func (p *partner) messages(t testing.TB) []*hl7.Message {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*hl7.Message
	for _, r := range p.received {
		m, err := hl7.Parse(r.raw)
		if err != nil {
			t.Fatalf("partner received an unparsable message: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// failFirst answers code to the first times receipts of id (to every one
// when times is 0) and accepts everything else.
func failFirst(id string, times int, code hl7.AckCode) answerFunc {
	return func(_ context.Context, got string, n int) hl7.AckCode {
		if got == id && (times == 0 || n <= times) {
			return code
		}
		return hl7.AckAccept
	}
}

// gate holds the first caller of hold until the test lets it go: a send a
// partner has not answered yet, a hand-off turn in flight.
type gate struct {
	arrived chan struct{} // closed when the first caller arrives
	release chan struct{} // closed by let
	first   sync.Once
	once    sync.Once
}

// newGate returns a gate that is let go at the latest when the test ends.
func newGate(t testing.TB) *gate {
	g := &gate{arrived: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(g.let)
	return g
}

// hold blocks the first caller until let; later callers go on at once.
func (g *gate) hold() { g.first.Do(func() { close(g.arrived); <-g.release }) }

// let lets the held caller go on.
func (g *gate) let() { g.once.Do(func() { close(g.release) }) }

// wait fails the test unless what is held arrives at the gate.
func (g *gate) wait(t testing.TB, what string) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never reached the partner", what)
	}
}

// holdFirst is a partner's answer that holds the first receipt of id at g
// and accepts everything.
func holdFirst(g *gate, id string) answerFunc {
	return func(_ context.Context, got string, n int) hl7.AckCode {
		if got == id && n == 1 {
			g.hold()
		}
		return hl7.AckAccept
	}
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

// controlIDs are format applied to 0 to n-1, such as "W%03d".
func controlIDs(format string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(format, i)
	}
	return ids
}

// adts are ADT^A01 messages with the given control ids, the i-th for
// patient(i).
func adts(ids []string, patient func(i int) string) [][]byte {
	msgs := make([][]byte, len(ids))
	for i, id := range ids {
		msgs[i] = adt(id, patient(i))
	}
	return msgs
}

// onePatient gives every message patient P1; patientEach gives the i-th
// message patient P<i>.
func onePatient(int) string    { return "P1" }
func patientEach(i int) string { return fmt.Sprintf("P%d", i) }

// parseConfig parses a test's config file text.
func parseConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatalf("test config: %v\n%s", err, y)
	}
	return cfg
}

// adtYAML is a one-channel config's text, delivering ADT to the given
// destinations YAML.
func adtYAML(listen, destinations string) string {
	return fixtures.ADTChannel(listen) + fmt.Sprintf(`
      - name: out
        match: {message_type: [ADT]}
        destinations: [%s]
destinations:
%s`, destNames(destinations), destinations)
}

// adtToDown is a config's text: the cluster timings, then channel adt
// listening for MLLP on listen with the further mllp settings opts (""
// for none, else starting with a comma), on line 4, routed to the MLLP
// destination down at addr; more (top-level sections) follows.
func adtToDown(listen, opts, addr, more string) string {
	return fmt.Sprintf(`%s
channels:
  adt:
    inbound: {mllp: {listen: %q%s}}
    routes: [{destinations: [down]}]
destinations:
  down: {type: mllp, mllp: {address: %q}}
`, fixtures.ClusterTimings, listen, opts, addr) + more
}

// testConfig is adtYAML parsed.
func testConfig(t testing.TB, listen, destinations string) *config.Config {
	t.Helper()
	return parseConfig(t, adtYAML(listen, destinations))
}

// idleConfig is a testConfig whose one destination is a directory nothing
// is sent to, for tests of a node rather than of its deliveries.
func idleConfig(t testing.TB) *config.Config {
	t.Helper()
	return testConfig(t, fixtures.FreeAddr(t), `
  out:
    type: file
    file: {directory: ./unused}
`)
}

// mllpDest is an MLLP destination's entry in a destinations block: name
// delivering to addr, with mllpOpts as further keys of its mllp map ("" for
// none, or such as "connect_timeout: 1s") and more lines of its block
// (retry, ordering, record_batch...), each one string.
func mllpDest(name, addr, mllpOpts string, more ...string) string {
	if mllpOpts != "" {
		mllpOpts = ", " + mllpOpts
	}
	b := fmt.Sprintf("  %s:\n    type: mllp\n    mllp: {address: %q%s}\n", name, addr, mllpOpts)
	for _, l := range more {
		b += "    " + l + "\n"
	}
	return b
}

// stuckLab is destination lab at addr, whose partner answers rejectAll:
// it retries the rejects, so its queue stays stuck.
func stuckLab(addr string) string {
	return mllpDest("lab", addr, "", "on_reject: retry", "retry: {backoff: 100ms, multiplier: 1, max_attempts: 1000}")
}

// rejectAll is a partner's answer that rejects every message.
func rejectAll(context.Context, string, int) hl7.AckCode { return hl7.AckReject }

// downstream is the destinations block of testConfig for one MLLP
// destination "downstream" at addr, with more lines of its block.
func downstream(addr string, more ...string) string {
	return mllpDest("downstream", addr, "", more...)
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

// channelsTo is a config of one channel per partner, c<i> listening on a
// free port and routing to destination d<i>, which delivers to
// partners[i]; it returns the channels' listen addresses.
func channelsTo(t *testing.T, partners ...*partner) (*config.Config, []string) {
	t.Helper()
	var y strings.Builder
	listens := make([]string, len(partners))
	y.WriteString("cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}\nchannels:\n")
	for i := range listens {
		listens[i] = fixtures.FreeAddr(t)
		fmt.Fprintf(&y, "  c%d:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, destinations: [d%d]}\n", i, listens[i], i)
	}
	y.WriteString("destinations:\n")
	for i, p := range partners {
		fmt.Fprintf(&y, "  d%d: {type: mllp, mllp: {address: %q}}\n", i, p.addr)
	}
	return parseConfig(t, y.String()), listens
}

// newPartners are n partners that accept everything.
func newPartners(t *testing.T, n int) []*partner {
	t.Helper()
	ps := make([]*partner, n)
	for i := range ps {
		ps[i] = newPartner(t, "", nil)
	}
	return ps
}

// startDownstream starts a node on db whose one channel delivers to
// destination downstream at a new partner answering with answer; more are
// lines of the destination's block (see downstream) and mod, when not nil,
// changes the node's options. It returns the node, the partner and the
// channel's listen address.
func startDownstream(t *testing.T, db *testcontainers.DB, answer answerFunc, mod func(*engine.Options), more ...string) (*engine.Node, *partner, string) {
	t.Helper()
	p := newPartner(t, "", answer)
	listen := fixtures.FreeAddr(t)
	n := cluster.StartNode(t, db, testConfig(t, listen, downstream(p.addr, more...)), mod)
	return n, p, listen
}

// startTracedNode starts a node on db whose sessions report every
// statement to tracer, its drainers lingering for linger, with one channel
// delivering to a fresh partner. It returns the channel's listen address
// and the partner.
func startTracedNode(t *testing.T, db *testcontainers.DB, tracer pgx.QueryTracer, linger time.Duration) (string, *partner) {
	t.Helper()
	pool := db.TracedPool(t, tracer) // closed after the node's stop, registered below
	_, p, listen := startDownstream(t, db, nil, func(o *engine.Options) {
		o.Pool = pool
		o.Limits.Linger = linger
	})
	return listen, p
}

// named sets a node's id.
func named(id string) func(*engine.Options) {
	return func(o *engine.Options) { o.NodeID = id }
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

// sendOne sends one message on its own connection and returns the ACK, or
// the error when no ACK came.
func sendOne(addr string, msg []byte) (hl7.Ack, error) {
	c := &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second}
	defer c.Close()
	raw, err := c.Send(context.Background(), msg)
	if err != nil {
		return hl7.Ack{}, err
	}
	ack, err := hl7.ParseACK(raw)
	if err != nil {
		return hl7.Ack{}, errors.Join(errors.New("reply is not an ACK"), err)
	}
	return ack, nil
}

// ours keeps the control ids of ids that start with prefix. Partners listen
// on port 0, and a test of another package may point a node at a port it
// closed for a partner that is down; should the kernel give that port to
// one of ours, its messages would arrive too. Tests look at their own.
func ours(ids []string, prefix string) []string {
	var out []string
	for _, id := range ids {
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	return out
}

// firstDeliveries keeps the first occurrence of each id, in order.
func firstDeliveries(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
