package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Config changes: a reload (SIGHUP) applies a node's file and the other
// nodes converge, what must wait for a restart is refused, and the rows of
// a destination that is no longer in the file are dead-lettered, by a
// reload or at start, but only once the cluster agrees on the file.

// reloadYAML is adtYAML's config with the destinations given as name →
// MLLP address, each with more lines of its block.
type reloadYAML struct {
	heartbeat string // "" means 1s (fence 3s, lease 5s)
	listen    string // each node needs its own: they run on one host here
	dests     [][2]string
	backoff   string
	more      []string
}

func (y reloadYAML) String() string {
	var b strings.Builder
	for _, d := range y.dests {
		more := y.more
		if y.backoff != "" {
			more = append([]string{fmt.Sprintf("retry: {backoff: %s, max_backoff: %s}", y.backoff, y.backoff)}, more...)
		}
		b.WriteString(mllpDest(d[0], d[1], "", more...))
	}
	s := adtYAML(y.listen, b.String())
	switch y.heartbeat {
	case "", "1s":
		return s
	case "20s":
		return strings.Replace(s, fixtures.ClusterTimings, "cluster: {heartbeat: 20s, fence_timeout: 40s, lease_ttl: 60s}", 1)
	default:
		return strings.Replace(s, fixtures.ClusterTimings, fmt.Sprintf("cluster: {heartbeat: %s, fence_timeout: 3s, lease_ttl: 5s}", y.heartbeat), 1)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// configFile writes content to a fresh file and loads it, as `mefor run`
// does.
func configFile(t *testing.T, name, content string) (string, *config.Config) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	writeFile(t, path, content)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return path, cfg
}

func receive(t *testing.T, n *engine.Node, controlID string) {
	t.Helper()
	if _, err := n.Intake().Receive(context.Background(), "adt", "test", "test", adt(controlID, "P1")); err != nil {
		t.Fatalf("receive %s: %v", controlID, err)
	}
}

func configStatus(t *testing.T, db *testcontainers.DB) map[string]leader.NodeConfig {
	t.Helper()
	st, err := ops.ConfigStatus(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]leader.NodeConfig{}
	for _, n := range st.Nodes {
		out[n.Node] = n
	}
	return out
}

func clusterVersion(t *testing.T, db *testcontainers.DB) int64 {
	t.Helper()
	cc, err := leader.ReadClusterConfig(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return cc.Version
}

// startFromFile starts node a on db from file a.yaml holding y, as `mefor
// run` does, and returns it with the file's path and its config.
func startFromFile(t *testing.T, db *testcontainers.DB, y reloadYAML) (*engine.Node, string, *config.Config) {
	t.Helper()
	path, cfg := configFile(t, "a.yaml", y.String())
	return cluster.StartNode(t, db, cfg, named("a")), path, cfg
}

// refusedChangesNothing fails the test unless n still runs cfg and the
// cluster's config version is still 0, as after a refused reload.
func refusedChangesNothing(t *testing.T, db *testcontainers.DB, n *engine.Node, cfg *config.Config) {
	t.Helper()
	if n.Config().Hash() != cfg.Hash() || clusterVersion(t, db) != 0 {
		t.Fatal("a refused reload changed the config or the cluster version")
	}
}

// reloadPair is nodes a and b on one database, each started from its own
// copy of a config whose destination down is at partner p1. The nodes
// share a host here, so their copies differ in the listen address (la,
// lb): b's is flagged as a different file.
type reloadPair struct {
	heartbeat    string
	p1, p2       *partner
	la, lb       string
	pathA, pathB string
	cfgA, cfgB   *config.Config
	a, b         *engine.Node
}

// startReloadPair starts a reloadPair whose config has the given
// heartbeat (see reloadYAML).
func startReloadPair(t *testing.T, db *testcontainers.DB, heartbeat string) *reloadPair {
	t.Helper()
	r := &reloadPair{heartbeat: heartbeat, p1: newPartner(t, "", nil), p2: newPartner(t, "", nil),
		la: fixtures.FreeAddr(t), lb: fixtures.FreeAddr(t)}
	r.pathA, r.cfgA = configFile(t, "a.yaml", r.v1(r.la))
	r.pathB, r.cfgB = configFile(t, "b.yaml", r.v1(r.lb))
	r.a = cluster.StartNode(t, db, r.cfgA, named("a"))
	r.b = cluster.StartNode(t, db, r.cfgB, named("b"))
	return r
}

// v1 is the config the nodes start with, for a node listening on listen;
// v2 is the same with down moved to partner p2.
func (r *reloadPair) v1(listen string) string {
	return reloadYAML{listen: listen, heartbeat: r.heartbeat, dests: [][2]string{{"down", r.p1.addr}}}.String()
}

func (r *reloadPair) v2(listen string) string {
	return reloadYAML{listen: listen, heartbeat: r.heartbeat, dests: [][2]string{{"down", r.p2.addr}}}.String()
}

// SIGHUP on one node (Reload) applies its file and every other node reloads
// its own copy within a heartbeat: deliveries follow the new destination
// address on both, and status shows both on the new version and file.
func TestReloadConvergesAcrossNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	r := startReloadPair(t, db, "")

	receive(t, r.b, "M1")
	fixtures.Eventually(t, 20*time.Second, "M1 delivered to the first address", func() bool {
		return slices.Contains(r.p1.acceptedIDs(), "M1")
	})

	writeFile(t, r.pathA, r.v2(r.la))
	writeFile(t, r.pathB, r.v2(r.lb))
	hashB := loadHash(t, r.pathB)
	res, err := r.a.Reload(ctx)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if res.Version != 1 || !res.Changed || res.Hash == r.cfgA.Hash() {
		t.Fatalf("reload result = %+v, want version 1, changed, new hash", res)
	}
	fixtures.Eventually(t, 10*time.Second, "node b to reload its own file", func() bool {
		return r.b.AppliedConfigVersion() == 1 && r.b.Config().Hash() == hashB
	})

	receive(t, r.a, "M2")
	receive(t, r.b, "M3")
	fixtures.Eventually(t, 20*time.Second, "M2 and M3 delivered to the new address", func() bool {
		got := r.p2.acceptedIDs()
		return slices.Contains(got, "M2") && slices.Contains(got, "M3")
	})
	if got := r.p1.receivedIDs(); !slices.Equal(got, []string{"M1"}) {
		t.Errorf("old address received %v after the reload, want only M1", got)
	}

	// Each node records what it applied on its row just after applying it.
	var st map[string]leader.NodeConfig
	ok := func(id, want string) bool {
		n := st[id]
		return n.Version != nil && *n.Version == 1 && n.Hash == want && !n.Behind && n.HashMismatch == (id == "b") && n.Error == ""
	}
	deadline := time.Now().Add(10 * time.Second)
	for st = configStatus(t, db); !ok("a", res.Hash) || !ok("b", hashB); st = configStatus(t, db) {
		if time.Now().After(deadline) {
			t.Fatalf("status: a = %+v, b = %+v; want both version 1, own hash (a %s, b %s), only b's file flagged",
				st["a"], st["b"], res.Hash[:12], hashB[:12])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func loadHash(t *testing.T, path string) string {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Hash()
}

// A bad file changes nothing, on both paths: the node reloading it keeps its
// config and the cluster version, and a node converging to a bad copy keeps
// its config, records why, and converges by itself once its file is fixed.
func TestReloadBadFileChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	r := startReloadPair(t, db, "")
	bad := func(l string) string { return strings.Replace(r.v2(l), "type: mllp", "type: carrier-pigeon", 1) }

	// The node's own reload (SIGHUP).
	writeFile(t, r.pathA, bad(r.la))
	_, err := r.a.Reload(ctx)
	var cerrs config.Errors
	if !errors.As(err, &cerrs) || !strings.Contains(err.Error(), r.pathA+":") || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("reload of a bad file: err = %v, want the config errors with file:line", err)
	}
	if r.a.Config().Hash() != r.cfgA.Hash() || clusterVersion(t, db) != 0 {
		t.Fatalf("a bad file changed something: hash %s (want %s), cluster version %d (want 0)",
			r.a.Config().Hash()[:12], r.cfgA.Hash()[:12], clusterVersion(t, db))
	}
	if st := configStatus(t, db)["a"]; !strings.Contains(st.Error, "carrier-pigeon") {
		t.Errorf("node a's row does not say why the reload failed: %+v", st)
	}
	receive(t, r.a, "M1")
	fixtures.Eventually(t, 20*time.Second, "M1 delivered by the old config", func() bool {
		return slices.Contains(r.p1.acceptedIDs(), "M1")
	})

	// A peer's bad copy, when a good file is reloaded elsewhere.
	writeFile(t, r.pathA, r.v2(r.la))
	writeFile(t, r.pathB, bad(r.lb))
	res, err := r.a.Reload(ctx)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	fixtures.Eventually(t, 10*time.Second, "node b to record why it did not reload", func() bool {
		st := configStatus(t, db)["b"]
		return st.ErrorVersion != nil && *st.ErrorVersion == res.Version
	})
	st := configStatus(t, db)["b"]
	if !st.Behind || !strings.Contains(st.Error, r.pathB) || r.b.AppliedConfigVersion() != 0 || r.b.Config().Hash() != r.cfgB.Hash() {
		t.Fatalf("node b with a bad copy: status %+v, applied %d; want behind, old config, error naming %s",
			st, r.b.AppliedConfigVersion(), r.pathB)
	}
	if st := configStatus(t, db)["a"]; st.Error != "" || st.Behind {
		t.Errorf("node a still flagged after a good reload: %+v", st)
	}

	writeFile(t, r.pathB, r.v2(r.lb))
	hashB := loadHash(t, r.pathB)
	fixtures.Eventually(t, 10*time.Second, "node b to converge once its file is fixed", func() bool {
		return r.b.AppliedConfigVersion() == res.Version && r.b.Config().Hash() == hashB
	})
	// The node applies, then records it on its row: give the row a moment.
	fixtures.Eventually(t, 10*time.Second, "node b's row to show it converged", func() bool {
		st := configStatus(t, db)["b"]
		return !st.Behind && st.Error == ""
	})
}

// A node that starts after reloads happened takes the cluster version as
// applied: it has just read its file, so it must not reload it again (here
// the file on disk changed since it was read; a needless reload would show).
func TestNodeStartingLaterDoesNotReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p1, p2 := newPartner(t, "", nil), newPartner(t, "", nil)
	for range 2 {
		if _, err := leader.BumpClusterConfig(ctx, db.Pool, "earlier", "test"); err != nil {
			t.Fatal(err)
		}
	}
	l := fixtures.FreeAddr(t)
	path, cfg := configFile(t, "a.yaml", reloadYAML{listen: l, dests: [][2]string{{"down", p1.addr}}}.String())
	writeFile(t, path, reloadYAML{listen: l, dests: [][2]string{{"down", p2.addr}}}.String())
	n := cluster.StartNode(t, db, cfg, named("a"))

	time.Sleep(2500 * time.Millisecond) // two heartbeats: the watcher has looked twice
	if n.AppliedConfigVersion() != 2 || n.Config().Hash() != cfg.Hash() {
		t.Fatalf("node starting at cluster version 2: applied %d, hash %s; want 2 and the file it started with (%s)",
			n.AppliedConfigVersion(), n.Config().Hash()[:12], cfg.Hash()[:12])
	}
	if st := configStatus(t, db)["a"]; st.Version == nil || *st.Version != 2 || st.Behind || st.Hash != cfg.Hash() {
		t.Errorf("status of the new node = %+v, want applied version 2 and its hash", st)
	}
}

// Cluster timings are fixed at start: a reload changing them is refused and
// says a restart is needed; nothing changes.
func TestReloadRefusesClusterTimings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	l := fixtures.FreeAddr(t)
	n, path, cfg := startFromFile(t, db, reloadYAML{listen: l, dests: [][2]string{{"down", p.addr}}})

	writeFile(t, path, reloadYAML{listen: l, heartbeat: "2s", dests: [][2]string{{"down", p.addr}}}.String())
	_, err := n.Reload(ctx)
	var rerr *engine.RestartError
	if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "heartbeat") || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("reload changing the heartbeat: err = %v, want a RestartError naming it", err)
	}
	refusedChangesNothing(t, db, n, cfg)
}

// A channel whose listen address changed is rebound on the node that
// listens: the new address answers, the old one is closed.
func TestReloadRebindsChangedListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	addr1, addr2 := fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	n, path, _ := startFromFile(t, db, reloadYAML{listen: addr1, dests: [][2]string{{"down", p.addr}}})
	fixtures.Eventually(t, 10*time.Second, "the listener to be bound", func() bool { return n.ListenerAddrs()["adt"] == addr1 })

	writeFile(t, path, reloadYAML{listen: addr2, dests: [][2]string{{"down", p.addr}}}.String())
	res, err := n.Reload(ctx)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if !slices.Equal(res.Listeners, []string{"adt"}) || n.ListenerAddrs()["adt"] != addr2 {
		t.Fatalf("after moving the listener: result %v, addrs %v; want adt on %s", res.Listeners, n.ListenerAddrs(), addr2)
	}
	if acks := send(t, addr2, adt("L1", "P1")); acks[0].Code != hl7.AckAccept {
		t.Fatalf("new address answered %s", acks[0].Code)
	}
	if c, err := net.DialTimeout("tcp", addr1, time.Second); err == nil {
		c.Close()
		t.Fatalf("old address %s still accepts connections", addr1)
	}
	fixtures.Eventually(t, 20*time.Second, "L1 delivered", func() bool { return slices.Contains(p.acceptedIDs(), "L1") })
}

// A new listen address that cannot be bound refuses the whole reload.
func TestReloadRefusesUnbindableAddress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p1, p2 := newPartner(t, "", nil), newPartner(t, "", nil)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := fixtures.FreeAddr(t)
	n, path, cfg := startFromFile(t, db, reloadYAML{listen: addr, dests: [][2]string{{"down", p1.addr}}})
	fixtures.Eventually(t, 10*time.Second, "the listener to be bound", func() bool { return n.ListenerAddrs()["adt"] == addr })

	writeFile(t, path, reloadYAML{listen: busy.Addr().String(), dests: [][2]string{{"down", p2.addr}}}.String())
	if _, err := n.Reload(ctx); err == nil || !strings.Contains(err.Error(), "listen on") {
		t.Fatalf("reload onto a busy address: err = %v, want a listen error", err)
	}
	if n.Config().Hash() != cfg.Hash() || n.ListenerAddrs()["adt"] != addr {
		t.Fatalf("a refused reload changed the node: addrs %v", n.ListenerAddrs())
	}
}

// Rows still queued for a destination the reload removed are dead-lettered
// at once, with the reason, as a restart with that file would.
func TestReloadDeadLettersRowsOfRemovedDestination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	down := downAddr(t) // nothing listens: deliveries to "old" wait an hour
	l := fixtures.FreeAddr(t)
	n, path, _ := startFromFile(t, db, reloadYAML{listen: l, backoff: "1h", dests: [][2]string{{"old", down}, {"new", p.addr}}})
	receive(t, n, "R1")
	fixtures.Eventually(t, 20*time.Second, "the delivery to old to fail once and wait", func() bool {
		var k int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE destination = 'old' AND status = 'pending' AND attempts = 1`).Scan(&k)
		return k == 1
	})

	writeFile(t, path, reloadYAML{listen: l, backoff: "1h", dests: [][2]string{{"new", p.addr}}}.String())
	res, err := n.Reload(ctx)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if res.DeadLettered != 1 {
		t.Errorf("reload dead-lettered %d rows, want 1", res.DeadLettered)
	}
	var status, reason string
	if err := db.Pool.QueryRow(ctx, `SELECT status, last_error FROM mefor_work WHERE destination = 'old'`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || !strings.Contains(reason, `destination 'old' is not in the config`) {
		t.Errorf("row of the removed destination: status %s, reason %q", status, reason)
	}
}

// Rows queued for a destination that was removed from the config are
// dead-lettered when a node starts, with that reason, instead of blocking
// their lane forever; their messages end in error.
func TestRowsOfRemovedDestinationDeadLetteredAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	down := downAddr(t) // nothing listens: deliveries to "old" stay queued
	before := testConfig(t, listen, mllpDest("old", down, "", "retry: {backoff: 1h, max_backoff: 1h}"))
	n1 := cluster.Start(t, engine.Options{Config: before, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "n1"})
	send(t, listen, adt("R1", "P1"), adt("R2", "P2"))
	fixtures.Eventually(t, 20*time.Second, "both deliveries to fail once and wait", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE destination = 'old' AND status = 'pending'`).Scan(&n)
		return n == 2
	})
	if err := n1.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	p := newPartner(t, "", nil)
	after := testConfig(t, fixtures.FreeAddr(t), mllpDest("new", p.addr, ""))
	cluster.StartNode(t, db, after, nil)

	rows := queryRows(t, db, pgx.RowToStructByPos[struct{ Status, LastErr, MsgStatus string }], `
		SELECT w.status, w.last_error, m.status
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.destination = 'old' ORDER BY w.id`)
	for _, r := range rows {
		if r.Status != "dead" || r.LastErr != `destination 'old' is not in the config` || r.MsgStatus != "error" {
			t.Errorf("row: status %q, last_error %q, message %q; want dead, the reason, error", r.Status, r.LastErr, r.MsgStatus)
		}
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows for the removed destination, want 2", len(rows))
	}
}

// Node a runs with downstream down and 50 messages queued for it. Node b
// starts with an older file that lacks downstream. The cluster has not agreed
// on b's file (a runs another), so b must neither dead-letter those rows nor
// try to serve them: nothing ends dead, and once downstream is back node a
// delivers all 50, in order.
func TestNodeWithDifferentFileLeavesOthersRowsAlone(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	downAddr := downAddr(t) // nothing listens yet
	cfgA := testConfig(t, listen, mllpDest("downstream", downAddr, "connect_timeout: 200ms", "retry: {backoff: 200ms, max_backoff: 500ms}"))
	cluster.StartNode(t, db, cfgA, func(o *engine.Options) { o.NodeID = "a" })
	ids := controlIDs("OR%03d", 50)
	send(t, listen, adts(ids, onePatient)...)
	fixtures.Eventually(t, 30*time.Second, "all 50 queued for downstream", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE destination = 'downstream' AND status = 'pending'`) == 50
	})

	cfgB := testConfig(t, fixtures.FreeAddr(t), fmt.Sprintf(`
  archive:
    type: file
    file: {directory: %q}
`, t.TempDir()))
	cluster.StartNode(t, db, cfgB, func(o *engine.Options) { o.NodeID = "b" })
	// Give b time to do what it would: its start-up sweep and, should River
	// hand it the downstream lane, its drainer.
	time.Sleep(3 * time.Second)
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); n != 0 {
		t.Fatalf("%d rows dead-lettered by a node whose file the cluster has not agreed on", n)
	}

	p := newPartner(t, downAddr, nil)
	fixtures.Eventually(t, 60*time.Second, "all 50 delivered", func() bool { return len(ours(p.acceptedIDs(), "OR")) == len(ids) })
	if got := ours(p.acceptedIDs(), "OR"); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want all 50 in order", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); n != 0 {
		t.Fatalf("%d rows dead", n)
	}
}

// A send in flight when the reload changes its destination's address
// finishes on the old connection: it is delivered once, not cut off and
// retried; the next message goes to the new address.
func TestReloadDoesNotCutASendInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p2 := newPartner(t, "", nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := &mllp.Server{Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		once.Do(func() { close(arrived) })
		<-release
		msg, _ := hl7.Parse(raw)
		return hl7.NewACK(msg, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go slow.Serve(ln)
	t.Cleanup(func() { _ = slow.Shutdown(context.Background()) })

	l := fixtures.FreeAddr(t)
	n, path, _ := startFromFile(t, db, reloadYAML{listen: l, dests: [][2]string{{"down", ln.Addr().String()}}})
	receive(t, n, "S1")
	<-arrived
	writeFile(t, path, reloadYAML{listen: l, dests: [][2]string{{"down", p2.addr}}}.String())
	if _, err := n.Reload(ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	close(release)
	receive(t, n, "S2")
	fixtures.Eventually(t, 20*time.Second, "S2 delivered to the new address", func() bool {
		return slices.Contains(p2.acceptedIDs(), "S2")
	})
	var status string
	var attempts int
	if err := db.Pool.QueryRow(ctx, `
		SELECT w.status, w.attempts FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.stage = 'outbound' AND m.control_id = 'S1'`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "done" || attempts != 1 || slices.Contains(p2.receivedIDs(), "S1") {
		t.Errorf("send in flight during the reload: status %s after %d attempts (re-sent to new address: %v); want done after 1",
			status, attempts, slices.Contains(p2.receivedIDs(), "S1"))
	}
}

// Nodes hear of a reload through NOTIFY, not only at their next heartbeat:
// with a 20 s heartbeat, the peer still converges within seconds.
func TestReloadReachesPeersThroughNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	r := startReloadPair(t, db, "20s")
	time.Sleep(500 * time.Millisecond) // let b's LISTEN connection come up

	writeFile(t, r.pathA, r.v2(r.la))
	writeFile(t, r.pathB, r.v2(r.lb))
	if _, err := r.a.Reload(ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	fixtures.Eventually(t, 8*time.Second, "node b to reload well before its next heartbeat", func() bool {
		return r.b.AppliedConfigVersion() == 1
	})
}

// Encryption keys are read at start: a reload that adds an encryption:
// section (or names other keys) is refused and says a restart is needed.
func TestReloadRefusesEncryptionKeyChange(t *testing.T) {
	t.Setenv("MEFOR_RELOAD_TEST_KEYS", "k1=MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	l := fixtures.FreeAddr(t)
	n, path, cfg := startFromFile(t, db, reloadYAML{listen: l, dests: [][2]string{{"down", p.addr}}})

	writeFile(t, path, reloadYAML{listen: l, dests: [][2]string{{"down", p.addr}}}.String()+
		"encryption:\n  keys: \"${MEFOR_RELOAD_TEST_KEYS}\"\n")
	_, err := n.Reload(ctx)
	var rerr *engine.RestartError
	if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "encryption") || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("reload adding encryption keys: err = %v, want a RestartError naming them", err)
	}
	if strings.Contains(err.Error(), "MDEyMzQ1") {
		t.Errorf("the refusal shows the key: %v", err)
	}
	refusedChangesNothing(t, db, n, cfg)
}
