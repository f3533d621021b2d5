package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
)

// The harness of the multi-node failover tests: several `mefor run`
// processes on one database and one config, an in-process downstream partner
// that records every delivery, senders that fail over between the nodes'
// ports, and readers of the nodes' JSON logs.

// Fast cluster timings, so a failover takes about two seconds.
const (
	clHeartbeat    = 300 * time.Millisecond
	clFenceTimeout = 1200 * time.Millisecond
	clLeaseTTL     = 2 * time.Second
	clNodeTimeout  = 4 * time.Second
	clReclaim      = 500 * time.Millisecond
	// clSlack absorbs process scheduling on a busy 2-core machine.
	clSlack = time.Second
)

// The lanes under test: one channel per lane prefix, each routed to its own
// destination, so the ingress, routed and outbound lanes of each are
// separate and their order is checked separately.
var clLanes = []struct{ channel, prefix, env string }{
	{"adt", "A", "ADT_PORT"},
	{"lab", "L", "LAB_PORT"},
}

type cluster struct {
	t       *testing.T
	dir     string
	db      *testcontainers.DB
	cfg     string
	partner *partner
	nodes   []*clusterNode
}

type clusterNode struct {
	id    string
	ports map[string]string // channel -> 127.0.0.1:port
	dbURL string
	p     *proc
	// killedAt is set once the node has been SIGKILLed.
	killedAt time.Time
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), db: testcontainers.NewDB(t), partner: newPartner(t)}
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: {heartbeat: %s, fence_timeout: %s, lease_ttl: %s, node_timeout: %s}\n",
		clHeartbeat, clFenceTimeout, clLeaseTTL, clNodeTimeout)
	b.WriteString("channels:\n")
	for _, l := range clLanes {
		fmt.Fprintf(&b, "  %s:\n    inbound: {mllp: {listen: \"127.0.0.1:${%s}\"}}\n    routes: [{name: out, destinations: [%s_out]}]\n",
			l.channel, l.env, l.channel)
	}
	b.WriteString("destinations:\n")
	for _, l := range clLanes {
		fmt.Fprintf(&b, "  %s_out:\n    type: mllp\n    mllp: {address: %q}\n    retry: {max_attempts: 0, backoff: 100ms, max_backoff: 1s}\n",
			l.channel, c.partner.addr)
	}
	c.cfg = filepath.Join(c.dir, "mefor.yaml")
	if err := os.WriteFile(c.cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runMefor(t, c.dir, c.env(c.db.URL), "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	return c
}

func (c *cluster) env(dbURL string) []string { return []string{"DATABASE_URL=" + dbURL} }

// node prepares a node with its own listener ports, not started yet, so
// senders can know every node's ports up front; dbURL overrides the database
// address (to route it through a proxy).
func (c *cluster) node(id, dbURL string) *clusterNode {
	c.t.Helper()
	if dbURL == "" {
		dbURL = c.db.URL
	}
	n := &clusterNode{id: id, ports: map[string]string{}, dbURL: dbURL}
	c.nodes = append(c.nodes, n)
	for _, l := range clLanes {
		n.ports[l.channel] = c.uniquePort()
	}
	return n
}

// uniquePort is a free port no other node of the cluster was given:
// freePort closes its probe, so two calls can return the same port, and a
// node then binds the port another node just unbound.
func (c *cluster) uniquePort() string {
	c.t.Helper()
	for {
		addr := freePort(c.t)
		used := false
		for _, n := range c.nodes {
			for _, a := range n.ports {
				used = used || a == addr
			}
		}
		if !used {
			return addr
		}
	}
}

// run starts the node's `mefor run` process.
func (c *cluster) run(n *clusterNode) {
	c.t.Helper()
	env := c.env(n.dbURL)
	for _, l := range clLanes {
		_, port, _ := net.SplitHostPort(n.ports[l.channel])
		env = append(env, l.env+"="+port)
	}
	n.p = startProc(c.t, c.dir, env, "--log-format", "json", "run", "--config", c.cfg, "--node-id", n.id,
		"--admin-listen=", "--reclaim-interval", clReclaim.String())
}

// waitHolder waits until n has acquired the lease and bound every listener.
func (c *cluster) waitHolder(n *clusterNode, timeout time.Duration) {
	c.t.Helper()
	eventuallyT(c.t, timeout, n.id+" holding the lease and listening on every channel", func() bool {
		return n.boundChannels() == len(clLanes)
	})
	for _, addr := range n.ports {
		waitListening(c.t, addr)
	}
}

// waitJoined waits until the node has registered and runs (as a standby).
func (c *cluster) waitJoined(n *clusterNode, timeout time.Duration) {
	c.t.Helper()
	eventuallyT(c.t, timeout, n.id+" running", func() bool { return len(n.logs("node running")) > 0 })
}

// pollT is eventuallyT at a slower pace, for conditions that run a CLI
// process each time: a process every 50ms would load the machine the nodes
// under test run on.
func pollT(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// eventually is eventuallyT that, on timeout, shows the database sessions
// and the nodes' lease edges.
func (c *cluster) eventually(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s\nsessions:\n%s\n%s", timeout, what, c.dbActivity(), c.dumpEdges())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---- node logs ----

type logLine struct {
	Time    time.Time
	Msg     string
	Node    string
	Channel string
	Addr    string
	Raw     string
}

// logs returns the node's JSON log lines, only those with one of msgs when
// any are given.
func (n *clusterNode) logs(msgs ...string) []logLine {
	if n.p == nil {
		return nil
	}
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(n.p.out.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l struct {
			Time    time.Time `json:"time"`
			Msg     string    `json:"msg"`
			Node    string    `json:"node"`
			Channel string    `json:"channel"`
			Addr    string    `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		if len(msgs) > 0 && !slices.Contains(msgs, l.Msg) {
			continue
		}
		out = append(out, logLine{Time: l.Time, Msg: l.Msg, Node: l.Node, Channel: l.Channel, Addr: l.Addr, Raw: line})
	}
	return out
}

// boundChannels is how many channels the node listens on now, per its log.
func (n *clusterNode) boundChannels() int {
	bound := map[string]bool{}
	for _, l := range n.logs("listening", "stopped listening") {
		bound[l.Channel] = l.Msg == "listening"
	}
	k := 0
	for _, b := range bound {
		if b {
			k++
		}
	}
	return k
}

// leaseEdgesAfter lists the node's lease-edge log lines at or after t.
func (n *clusterNode) leaseEdgesAfter(t time.Time, msgs ...string) []logLine {
	if len(msgs) == 0 {
		msgs = []string{"listener lease acquired", "listener lease renewed after gap", "listener lease lost",
			"listener lease fenced", "listener lease released"}
	}
	var out []logLine
	for _, l := range n.logs(msgs...) {
		if !l.Time.Before(t) {
			out = append(out, l)
		}
	}
	return out
}

// interval is a span during which a node had a channel's listener bound.
type interval struct {
	node, channel string
	from, to      time.Time // to is zero while still bound
}

// bindIntervals reads the node's bind/unbind log lines. A killed node's
// open intervals end at the kill.
func (n *clusterNode) bindIntervals() []interval {
	var out []interval
	open := map[string]int{}
	for _, l := range n.logs("listening", "stopped listening") {
		l.Channel = "channel " + l.Channel
		if l.Msg == "listening" {
			open[l.Channel] = len(out)
			out = append(out, interval{node: n.id, channel: l.Channel, from: l.Time})
			continue
		}
		if i, ok := open[l.Channel]; ok {
			out[i].to = l.Time
			delete(open, l.Channel)
		}
	}
	for _, i := range open {
		out[i].to = n.killedAt // zero (open) unless killed
	}
	return out
}

// firstAfter is the time of the first of n's log lines with msg at or after
// t, for channel ch when ch is not empty.
func (n *clusterNode) firstAfter(t time.Time, msg, ch string) (time.Time, bool) {
	for _, l := range n.logs(msg) {
		if !l.Time.Before(t) && (ch == "" || l.Channel == ch) {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// lastBindAfter is when n had bound every channel after t (the latest of
// its "listening" lines for each channel), and whether it had.
func (n *clusterNode) boundAllAfter(t time.Time) (time.Time, bool) {
	var last time.Time
	for _, l := range clLanes {
		at, ok := n.firstAfter(t, "listening", l.channel)
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// unboundAllAfter is when n had unbound every channel after t.
func (n *clusterNode) unboundAllAfter(t time.Time) (time.Time, bool) {
	var last time.Time
	for _, l := range clLanes {
		at, ok := n.firstAfter(t, "stopped listening", l.channel)
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// leaseIntervals reads the node's lease edges: from "acquired" (or
// "renewed after gap") to "lost", "fenced" or "released". A killed node's
// open interval ends at the kill.
func (n *clusterNode) leaseIntervals() []interval {
	var out []interval
	open := -1
	for _, l := range n.leaseEdgesAfter(time.Time{}) {
		switch l.Msg {
		case "listener lease acquired", "listener lease renewed after gap":
			if open < 0 {
				open = len(out)
				out = append(out, interval{node: n.id, channel: "(lease)", from: l.Time})
			}
		default:
			if open >= 0 {
				out[open].to = l.Time
				open = -1
			}
		}
	}
	if open >= 0 {
		out[open].to = n.killedAt
	}
	return out
}

// assertNoOverlap fails when two nodes had the same channel bound, or both
// held the lease, at the same time, according to their own logs (one host
// clock for all). Not for a frozen node: it cannot log while frozen.
func (c *cluster) assertNoOverlap() {
	c.t.Helper()
	var all []interval
	for _, n := range c.nodes {
		all = append(all, n.bindIntervals()...)
		all = append(all, n.leaseIntervals()...)
	}
	end := func(i interval) time.Time {
		if i.to.IsZero() {
			return time.Now().Add(time.Hour)
		}
		return i.to
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.node == b.node || a.channel != b.channel {
				continue
			}
			if a.from.Before(end(b)) && b.from.Before(end(a)) {
				c.t.Errorf("%s on two nodes at once: %s %s..%s and %s %s..%s", a.channel,
					a.node, a.from.Format(time.StampMicro), fmtEnd(a.to), b.node, b.from.Format(time.StampMicro), fmtEnd(b.to))
			}
		}
	}
}

// assertRetakenOnlyAfterGiveUp fails when old took the lease again after
// since while cur still held it. On a slow machine cur may fence itself
// (its renewals late) and old take over legitimately; that is logged.
func (c *cluster) assertRetakenOnlyAfterGiveUp(old, cur *clusterNode, since time.Time) {
	c.t.Helper()
	again := old.leaseEdgesAfter(since, "listener lease acquired", "listener lease renewed after gap")
	if len(again) == 0 {
		return
	}
	gaveUp := cur.leaseEdgesAfter(since, "listener lease lost", "listener lease fenced", "listener lease released")
	if len(gaveUp) == 0 || !gaveUp[0].Time.Before(again[0].Time) {
		c.t.Errorf("%s took the lease again (%s) while %s held it\n%s", old.id, again[0].Raw, cur.id, c.dumpEdges())
		return
	}
	c.t.Logf("note: %s took the lease again %v after %s logged %q (its renewals were late on this machine)",
		old.id, again[0].Time.Sub(gaveUp[0].Time).Round(time.Millisecond), cur.id, gaveUp[0].Msg)
}

// logHolder is the node whose own log says it holds the lease now.
func (c *cluster) logHolder() string {
	for _, n := range c.nodes {
		for _, i := range n.leaseIntervals() {
			if i.to.IsZero() {
				return n.id
			}
		}
	}
	return ""
}

// assertHolderAgrees checks that `mefor nodes` shows as lease holder the
// node whose log says it holds the lease, and that only it listens.
func (c *cluster) assertHolderAgrees() {
	c.t.Helper()
	var want, got string
	deadline := time.Now().Add(5 * time.Second)
	for {
		want = c.logHolder()
		got, _ = c.holderPerNodes()
		if got == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond) // an edge may be between the log and the database
	}
	if got != want {
		c.t.Errorf("mefor nodes shows %q holding the lease, the nodes' logs say %q\n%s", got, want, c.dumpEdges())
	}
	for _, n := range c.nodes {
		if n.killedAt.IsZero() && n.id != want && n.boundChannels() != 0 {
			c.t.Errorf("%s listens on %d channels while %q holds the lease\n%s", n.id, n.boundChannels(), want, c.dumpEdges())
		}
	}
}

func fmtEnd(t time.Time) string {
	if t.IsZero() {
		return "(still bound)"
	}
	return t.Format(time.StampMicro)
}

// ---- CLI: nodes and stepdown ----

type nodeRow struct {
	ID          string    `json:"id"`
	Host        string    `json:"host"`
	PID         int       `json:"pid"`
	StartedAt   time.Time `json:"started_at"`
	LastSeen    time.Time `json:"last_seen"`
	Status      string    `json:"status"`
	HoldsLease  bool      `json:"holds_lease"`
	RiverLeader bool      `json:"river_leader"`
}

func (c *cluster) nodesJSON() []nodeRow {
	c.t.Helper()
	out, err := runMefor(c.t, c.dir, c.env(c.db.URL), "nodes", "--json")
	if err != nil {
		c.t.Fatalf("mefor nodes --json: %v\n%s", err, out)
	}
	var rows []nodeRow
	if err := json.Unmarshal([]byte(jsonPart(out)), &rows); err != nil {
		c.t.Fatalf("mefor nodes --json: %v\n%s", err, out)
	}
	holders := 0
	for _, r := range rows {
		if r.HoldsLease {
			holders++
		}
	}
	if holders > 1 {
		c.t.Fatalf("mefor nodes shows %d lease holders:\n%s", holders, out)
	}
	return rows
}

// holderPerNodes is the node `mefor nodes` shows holding the lease ("" if none).
func (c *cluster) holderPerNodes() (holder, riverLeader string) {
	for _, r := range c.nodesJSON() {
		if r.HoldsLease {
			holder = r.ID
		}
		if r.RiverLeader {
			riverLeader = r.ID
		}
	}
	return holder, riverLeader
}

type stepdownResult struct {
	Outcome    string     `json:"outcome"`
	Node       string     `json:"node"`
	WasHolder  bool       `json:"was_holder"`
	ReleasedAt *time.Time `json:"released_at"`
	Holder     string     `json:"holder"`
	NewHolder  string     `json:"new_holder"`
}

// stepdown runs `mefor stepdown ARGS --json` and returns its answer and exit
// code.
func (c *cluster) stepdown(args ...string) (stepdownResult, int, string) {
	c.t.Helper()
	cmd := exec.Command(meforBinary(c.t), append([]string{"stepdown", "--json"}, args...)...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), c.env(c.db.URL)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("mefor stepdown: %v", err)
	}
	all := stdout.String() + stderr.String()
	var r stepdownResult
	if err := json.Unmarshal([]byte(jsonPart(stdout.String())), &r); err != nil {
		c.t.Fatalf("mefor stepdown %v (exit %d): output is not JSON: %v\n%s", args, code, err, all)
	}
	return r, code, all
}

// jsonPart drops anything before the first JSON value (a log line or a
// warning on the same stream).
func jsonPart(s string) string {
	if i := strings.IndexAny(s, "[{"); i > 0 {
		return s[i:]
	}
	return s
}

// ---- the downstream partner ----

// partner is the downstream system of every destination, in this process, so
// it sees every delivery including repeats.
type partner struct {
	addr string
	mu   sync.Mutex
	got  []delivery
}

type delivery struct {
	id string
	at time.Time
}

func newPartner(t *testing.T) *partner {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partner{addr: ln.Addr().String()}
	srv := &mllp.Server{Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		m, err := hl7.Parse(raw)
		if err != nil {
			return nil
		}
		p.mu.Lock()
		p.got = append(p.got, delivery{id: m.ControlID(), at: time.Now()})
		p.mu.Unlock()
		time.Sleep(2 * time.Millisecond) // a partner that takes a moment, so failures land mid-delivery
		return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return p
}

func (p *partner) deliveries() []delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// deliveredAllBy is the time by which every id in want had been delivered
// at least once, and whether it has been.
func (p *partner) deliveredAllBy(want []string) (time.Time, bool) {
	first := map[string]time.Time{}
	for _, d := range p.deliveries() {
		if _, ok := first[d.id]; !ok {
			first[d.id] = d.at
		}
	}
	var last time.Time
	for _, id := range want {
		at, ok := first[id]
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// ---- the failover-aware sender ----

// sender sends one lane's messages in sequence, each only after the one
// before was acknowledged, trying each node's port in turn and resending a
// message until some node answers AA, as a real sending system does.
type sender struct {
	channel, prefix string
	addrs           []string // one per node, in c.nodes order
	nodeIDs         []string
	clients         []*mllp.Client

	mu    sync.Mutex
	acks  []ack
	next  int
	noAA  int // attempts that got no AA
	start time.Time
}

type ack struct {
	id   string
	node string
	at   time.Time
}

func (c *cluster) newSender(channel, prefix string) *sender {
	s := &sender{channel: channel, prefix: prefix}
	for _, n := range c.nodes {
		s.addrs = append(s.addrs, n.ports[channel])
		s.nodeIDs = append(s.nodeIDs, n.id)
		// The ACK timeout is short so a frozen or cut-off node costs the
		// sender two seconds, not thirty.
		s.clients = append(s.clients, &mllp.Client{Addr: n.ports[channel], AckTimeout: 2 * time.Second, DialTimeout: 300 * time.Millisecond})
	}
	c.t.Cleanup(func() {
		for _, cl := range s.clients {
			cl.Close()
		}
	})
	return s
}

func clMessage(id string) []byte {
	return []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|" + id + "|P|2.5\rPID|1||" + id + "\r")
}

// run sends messages until ctx ends, pausing pace between messages. The
// message in hand when ctx ends is abandoned unacknowledged.
func (s *sender) run(ctx context.Context, pace time.Duration) {
	cur := 0
	for i := 0; ctx.Err() == nil; i++ {
		id := fmt.Sprintf("%s%05d", s.prefix, i)
		for tries := 0; ctx.Err() == nil; tries++ {
			k := (cur + tries) % len(s.clients)
			if tries > 0 && tries%len(s.clients) == 0 {
				time.Sleep(20 * time.Millisecond) // nobody answered: the lease is moving
			}
			raw, err := s.clients[k].Send(ctx, clMessage(id))
			if err == nil {
				if a, perr := hl7.ParseACK(raw); perr == nil && a.Code == hl7.AckAccept {
					s.mu.Lock()
					s.acks = append(s.acks, ack{id: id, node: s.nodeIDs[k], at: time.Now()})
					s.mu.Unlock()
					cur = k
					break
				}
			}
			s.mu.Lock()
			s.noAA++
			s.mu.Unlock()
		}
		if pace > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(pace):
			}
		}
	}
}

func (s *sender) acked() []ack {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acks)
}

func (s *sender) ackedIDs() []string {
	var ids []string
	for _, a := range s.acked() {
		ids = append(ids, a.id)
	}
	return ids
}

// firstAckAfter is the first AA from a node other than not, at or after t.
func (s *sender) firstAckAfter(t time.Time, not string) (ack, bool) {
	for _, a := range s.acked() {
		if !a.at.Before(t) && a.node != not {
			return a, true
		}
	}
	return ack{}, false
}

// traffic runs one sender per lane until stop is called.
type traffic struct {
	senders []*sender
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func (c *cluster) startTraffic() *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel}
	for _, l := range clLanes {
		s := c.newSender(l.channel, l.prefix)
		tr.senders = append(tr.senders, s)
		tr.wg.Add(1)
		go func() { defer tr.wg.Done(); s.run(ctx, 10*time.Millisecond) }()
	}
	c.t.Cleanup(tr.stop)
	return tr
}

func (tr *traffic) stop() { tr.cancel(); tr.wg.Wait() }

// waitAcked waits until every lane has at least n more AAs than now.
func (c *cluster) waitAcked(tr *traffic, n int, timeout time.Duration) {
	c.t.Helper()
	base := make([]int, len(tr.senders))
	for i, s := range tr.senders {
		base[i] = len(s.acked())
	}
	deadline := time.Now().Add(timeout)
	for {
		done := true
		for i, s := range tr.senders {
			done = done && len(s.acked()) >= base[i]+n
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			var got []string
			for i, s := range tr.senders {
				got = append(got, fmt.Sprintf("%s +%d", s.channel, len(s.acked())-base[i]))
			}
			c.t.Fatalf("timed out after %s waiting for %d more acknowledged messages per lane (got %v)\nsessions:\n%s\n%s",
				timeout, n, got, c.dbActivity(), c.dumpEdges())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dbActivity describes the test database's sessions: what each waits on and
// who blocks it (for a failed test).
func (c *cluster) dbActivity() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.db.Pool.Query(ctx, `
		SELECT pid, coalesce(state, ''), coalesce(wait_event_type || '/' || wait_event, ''),
			coalesce(extract(epoch FROM clock_timestamp() - xact_start)::float8, 0),
			pg_blocking_pids(pid)::text, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid int
		var state, wait, blockers, query string
		var xact float64
		if err := rows.Scan(&pid, &state, &wait, &xact, &blockers, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  pid %d %s wait=%s xact=%.1fs blocked_by=%s %q\n", pid, state, wait, xact, blockers, query)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, "  (reading sessions: %v)\n", err)
	}
	return b.String()
}

// firstAckAfter is, over all lanes, the latest of each lane's first AA from
// a node other than not after t: when every lane was served again.
func (tr *traffic) firstAckAfter(t time.Time, not string) (time.Time, bool) {
	var last time.Time
	for _, s := range tr.senders {
		a, ok := s.firstAckAfter(t, not)
		if !ok {
			return time.Time{}, false
		}
		if a.at.After(last) {
			last = a.at
		}
	}
	return last, true
}

// checkDelivered stops the traffic, waits until every acknowledged message
// reached the partner, and checks each lane's order: the deliveries, with
// repeats of an already delivered message removed, follow send order.
func (c *cluster) checkDelivered(tr *traffic, timeout time.Duration) {
	c.t.Helper()
	tr.stop()
	var acked []string
	for _, s := range tr.senders {
		acked = append(acked, s.ackedIDs()...)
	}
	deadline := time.Now().Add(timeout)
	for {
		if _, ok := c.partner.deliveredAllBy(acked); ok {
			break
		}
		if time.Now().After(deadline) {
			got := map[string]bool{}
			for _, d := range c.partner.deliveries() {
				got[d.id] = true
			}
			var missing []string
			for _, id := range acked {
				if !got[id] {
					missing = append(missing, id)
				}
			}
			c.t.Fatalf("after %s, %d of %d acknowledged messages were never delivered: %v", timeout, len(missing), len(acked), head(missing, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	all := c.partner.deliveries()
	dups := 0
	for _, s := range tr.senders {
		var firsts []string
		seen := map[string]bool{}
		for _, d := range all {
			if !strings.HasPrefix(d.id, s.prefix) {
				continue
			}
			if seen[d.id] {
				dups++
				continue
			}
			seen[d.id] = true
			firsts = append(firsts, d.id)
		}
		if !slices.IsSorted(firsts) { // ids are zero-padded in send order
			for i := 1; i < len(firsts); i++ {
				if firsts[i] < firsts[i-1] {
					c.t.Fatalf("lane %s delivered out of order: %s after %s (around %v)", s.channel, firsts[i], firsts[i-1],
						firsts[max(0, i-5):min(len(firsts), i+5)])
				}
			}
		}
	}
	c.t.Logf("acknowledged %d messages on %d lanes; %d deliveries, %d of them repeats", len(acked), len(tr.senders), len(all), dups)
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ---- a TCP proxy that can cut a node off from the database ----

// dbProxy forwards loopback connections to PostgreSQL. Cut blackholes every
// connection, existing and new, without closing anything, as a network
// partition does: the node sees no error, only silence, and PostgreSQL keeps
// the node's sessions, with their open transactions and locks. Heal closes
// the blackholed connections (their state is lost) and forwards new ones
// again.
//
// The proxy follows the protocol's message framing, so CutHoldingLaneLock
// can cut at the worst moment: right after a session took a lane lock in a
// transaction it has not committed.
type dbProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	armed bool // cut when a session holds a lane lock in an open transaction
	pairs map[*proxyPair]bool
}

type proxyPair struct {
	client, upstream net.Conn
	closed           bool

	stmts    map[string]string // prepared statement -> SQL, from the client's Parse messages
	lockSent bool              // a lane-lock statement ran since the last ReadyForQuery
}

// laneLockSQL marks the statement that takes a lane's transaction lock.
const laneLockSQL = "pg_advisory_xact_lock"

func newDBProxy(t *testing.T, target string) *dbProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dbProxy{ln: ln, target: target, pairs: map[*proxyPair]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for pp := range p.pairs {
			p.closeLocked(pp)
		}
		p.cut = false
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	return p
}

// url is dbURL with its host replaced by the proxy.
func (p *dbProxy) url(t *testing.T, dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *dbProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pp := &proxyPair{client: c, stmts: map[string]string{}}
		p.mu.Lock()
		p.pairs[pp] = true
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held, never forwarded; Heal closes it
		}
		go p.connect(pp)
	}
}

func (p *dbProxy) connect(pp *proxyPair) {
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	p.mu.Lock()
	if err != nil || pp.closed {
		p.closeLocked(pp)
		p.mu.Unlock()
		if u != nil {
			u.Close()
		}
		return
	}
	pp.upstream = u
	p.mu.Unlock()
	go p.pipe(pp, pp.client, u, true)
	go p.pipe(pp, u, pp.client, false)
}

// pipe copies src to dst one protocol message at a time, swallowing what it
// reads while the link is cut. The client's first message (startup) has no
// type byte; every other message in both directions has one. sslmode=disable
// means no SSL negotiation byte comes first.
func (p *dbProxy) pipe(pp *proxyPair, src, dst net.Conn, fromClient bool) {
	defer func() {
		p.mu.Lock()
		if !p.cut || pp.closed {
			p.closeLocked(pp)
		}
		p.mu.Unlock()
	}()
	r := bufio.NewReaderSize(src, 64<<10)
	typed := !fromClient
	for {
		var msg []byte
		hdr := 4
		if typed {
			hdr = 5
		}
		head := make([]byte, hdr)
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[hdr-4:]))
		if n < 4 || n > 1<<30 {
			return // not the framing this proxy understands
		}
		msg = make([]byte, hdr+n-4)
		copy(msg, head)
		if _, err := io.ReadFull(r, msg[hdr:]); err != nil {
			return
		}
		typed = true

		p.mu.Lock()
		for p.cut && !pp.closed {
			p.cond.Wait()
		}
		if pp.closed {
			p.mu.Unlock()
			return
		}
		if hdr == 5 {
			if fromClient {
				pp.noteClient(msg[0], msg[5:])
			} else if msg[0] == 'Z' && len(msg) > 5 {
				// ReadyForQuery carries the session's transaction status.
				if p.armed && msg[5] == 'T' && pp.lockSent {
					p.cut, p.armed = true, false
					p.cond.Broadcast()
				}
				pp.lockSent = false
			}
		}
		p.mu.Unlock()
		if _, err := dst.Write(msg); err != nil {
			return
		}
	}
}

// noteClient tracks which statements the client runs: a simple Query, or a
// Bind of a statement it prepared with Parse.
func (pp *proxyPair) noteClient(typ byte, body []byte) {
	cstr := func(b []byte) (string, []byte) {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return string(b), nil
		}
		return string(b[:i]), b[i+1:]
	}
	switch typ {
	case 'Q':
		q, _ := cstr(body)
		pp.lockSent = pp.lockSent || strings.Contains(q, laneLockSQL)
	case 'P':
		name, rest := cstr(body)
		q, _ := cstr(rest)
		pp.stmts[name] = q
	case 'B':
		_, rest := cstr(body) // portal
		stmt, _ := cstr(rest)
		pp.lockSent = pp.lockSent || strings.Contains(pp.stmts[stmt], laneLockSQL)
	}
}

func (p *dbProxy) closeLocked(pp *proxyPair) {
	if pp.closed {
		return
	}
	pp.closed = true
	_ = pp.client.Close()
	if pp.upstream != nil {
		_ = pp.upstream.Close()
	}
	delete(p.pairs, pp)
}

// Cut blackholes the link in both directions.
func (p *dbProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// CutHoldingLaneLock cuts the link the moment one of the node's sessions
// reports an open transaction in which it took a lane lock: PostgreSQL keeps
// that session, and the lock, while the node hears nothing. It returns when
// it cut, and false when no such moment came within d (then it cut anyway).
func (p *dbProxy) CutHoldingLaneLock(d time.Duration) (time.Time, bool) {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			return time.Now(), true
		}
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	p.armed, p.cut = false, true
	p.mu.Unlock()
	return time.Now(), false
}

// Heal closes every connection that lived through the cut and forwards new
// ones again.
func (p *dbProxy) Heal() {
	p.mu.Lock()
	for pp := range p.pairs {
		p.closeLocked(pp)
	}
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// ---- process control ----

func (n *clusterNode) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := n.p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, n.id, err)
	}
}

func (n *clusterNode) kill(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	n.p.stop(t, syscall.SIGKILL)
	n.killedAt = at
	return at
}

// rawProbe writes one framed message on a fresh connection to addr without
// waiting for the answer; answer reads it later.
type rawProbe struct {
	id   string
	conn net.Conn
}

func sendRawProbe(addr, id string) (*rawProbe, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	frame := append([]byte{0x0b}, clMessage(id)...)
	frame = append(frame, 0x1c, 0x0d)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(frame); err != nil {
		c.Close()
		return nil, err
	}
	return &rawProbe{id: id, conn: c}, nil
}

// answer reads whatever the node sends back within d: the ACK code, or ""
// when the connection closed or nothing came.
func (p *rawProbe) answer(d time.Duration) (code string, how string) {
	defer p.conn.Close()
	_ = p.conn.SetReadDeadline(time.Now().Add(d))
	buf, err := io.ReadAll(io.LimitReader(p.conn, 1<<16))
	if len(buf) > 0 {
		body := strings.Trim(string(buf), "\x0b\x1c\x0d")
		if a, perr := hl7.ParseACK([]byte(body)); perr == nil {
			return string(a.Code), "answered"
		}
		return "", "answered with something that is not an ACK"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "", "no answer"
	}
	return "", "connection closed"
}

// storedAt lists the received_at of every stored copy of a control id.
func (c *cluster) storedAt(id string) []time.Time {
	c.t.Helper()
	rows, err := c.db.Pool.Query(context.Background(), `SELECT received_at FROM mefor_message WHERE control_id = $1 ORDER BY id`, id)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			c.t.Fatal(err)
		}
		out = append(out, at)
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// runningDrainersOf counts River jobs running on node id right now.
func (c *cluster) runningDrainersOf(id string) int {
	var n int
	err := c.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by[array_length(attempted_by, 1)] = $1 AND kind IN ('mefor_ingress', 'mefor_routed', 'mefor_outbound')`, id).Scan(&n)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// dumpLogs shows every node's lease and listener lines (for a failed test).
func (c *cluster) dumpEdges() string {
	var b strings.Builder
	var all []logLine
	for _, n := range c.nodes {
		all = append(all, n.logs("listener lease acquired", "listener lease renewed after gap", "listener lease lost",
			"listener lease fenced", "listener lease released", "listening", "stopped listening")...)
	}
	slices.SortFunc(all, func(a, b logLine) int { return a.Time.Compare(b.Time) })
	for _, l := range all {
		fmt.Fprintf(&b, "%s %s %s %s\n", l.Time.Format(time.StampMicro), l.Node, l.Msg, l.Channel)
	}
	return b.String()
}
