package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Tests of javascript handlers through the real pipeline: MLLP in, the
// transform stage on PostgreSQL, MLLP out to partners that answer real
// ACKs.

// writeScript writes content to dir/name and returns its path.
func writeScript(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadConfig writes yaml as dir/mefor.yaml and loads it as a node would.
func loadConfig(t testing.TB, dir, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Load(writeScript(t, dir, "mefor.yaml", yaml))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return cfg
}

// fields returns path of every message, in order.
func fields(msgs []*hl7.Message, path string) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Get(path)
	}
	return out
}

// oneChannel is a config with channel adt sending every message through
// handler js (file script) to the partners named in dests.
func oneChannel(listen, script, jsExtra string, dests map[string]string) string {
	var names []string
	for n := range dests {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	fmt.Fprintf(&b, `
cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes:
      - {name: out, handler: js, destinations: [%s]}
handlers:
  js:
    type: javascript
    javascript: {file: %q%s}
destinations:
`, listen, strings.Join(names, ", "), script, jsExtra)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: {type: mllp, mllp: {address: %q}, retry: {backoff: 100ms}}\n", n, dests[n])
	}
	return b.String()
}

// startScript starts a node on db whose channel adt sends every message
// through the handler in script, written as dir/name (jsExtra: further keys
// of its javascript block), to partner lab; mod, when not nil, changes the
// node's options. It returns the node, lab, the channel's listen address
// and the script's path.
func startScript(t *testing.T, db *testcontainers.DB, dir, name, script, jsExtra string, mod func(*engine.Options)) (*engine.Node, *partner, string, string) {
	t.Helper()
	lab := newPartner(t, "", nil)
	js := writeScript(t, dir, name, script)
	listen := fixtures.FreeAddr(t)
	n := cluster.StartNode(t, db, loadConfig(t, dir, oneChannel(listen, js, jsExtra, map[string]string{"lab": lab.addr})), mod)
	return n, lab, listen, js
}

func TestScriptTransformFilterSplitAndDestinations(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	lab, archive := newPartner(t, "", nil), newPartner(t, "", nil)
	writeScript(t, dir, "lib/ids.js", `function mrn(id) { return "MRN-" + id; }`)
	js := writeScript(t, dir, "adt.js", `
function transform(msg, ctx) {
  var id = msg.get("PID-3.1");
  if (id.indexOf("TEST") === 0) return null;              // test patients are filtered out
  msg.set("PID-3.1", mrn(id));                             // from lib/ids.js
  var kind = msg.get("MSH-10").slice(0, 3);
  if (kind === "SPL") {                                    // one order split in three, in order
    var out = [];
    for (var i = 1; i <= 3; i++) { var c = msg.clone(); c.set("MSH-10", msg.get("MSH-10") + "-" + i); out.push(c); }
    return out;
  }
  if (kind === "SUB") return [{message: msg, destinations: ["archive"]}];
}`)
	listen := fixtures.FreeAddr(t)
	cfg := loadConfig(t, dir, oneChannel(listen, js, `, libs: [`+strconv.Quote(filepath.Join(dir, "lib/ids.js"))+`]`,
		map[string]string{"lab": lab.addr, "archive": archive.addr}))
	cluster.StartNode(t, db, cfg, nil)

	send(t, listen,
		adt("A1", "100"), adt("T1", "TEST9"), adt("SPL1", "200"), adt("SUB1", "300"), adt("A2", "400"))

	fixtures.Eventually(t, 30*time.Second, "every delivery", func() bool {
		return len(lab.acceptedIDs()) == 5 && len(archive.acceptedIDs()) == 6
	})
	if got, want := lab.acceptedIDs(), []string{"A1", "SPL1-1", "SPL1-2", "SPL1-3", "A2"}; !slices.Equal(got, want) {
		t.Errorf("lab received %v, want %v", got, want)
	}
	if got, want := archive.acceptedIDs(), []string{"A1", "SPL1-1", "SPL1-2", "SPL1-3", "SUB1", "A2"}; !slices.Equal(got, want) {
		t.Errorf("archive received %v, want %v", got, want)
	}
	if got, want := fields(lab.messages(t), "PID-3.1"), []string{"MRN-100", "MRN-200", "MRN-200", "MRN-200", "MRN-400"}; !slices.Equal(got, want) {
		t.Errorf("lab PID-3.1 %v, want %v", got, want)
	}
	fixtures.Eventually(t, 10*time.Second, "dispositions", func() bool {
		return messageStatus(t, db, "T1") == pipeline.StatusFiltered && countStatus(t, db, pipeline.StatusProcessed) == 4
	})
}

func TestScriptFailuresAreContained(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, lab, listen, js := startScript(t, db, t.TempDir(), "adt.js", `var runs = 0;
function transform(msg, ctx) {
  var id = msg.get("MSH-10");
  if (id === "THROW") {
    throw new Error("no visit for " + "this message");
  }
  if (id === "LOOP") { while (true) {} }
  if (id === "BAD") return "not a message";
  msg.set("ZVC-1", "ok");
}`, ", timeout: 300ms", nil)

	send(t, listen, adt("OK1", "P1"), adt("THROW", "SECRET-PATIENT"), adt("LOOP", "P3"), adt("BAD", "P4"), adt("OK2", "P5"))
	fixtures.Eventually(t, 30*time.Second, "the good messages delivered", func() bool { return len(lab.acceptedIDs()) == 2 })
	if got := lab.acceptedIDs(); !slices.Equal(got, []string{"OK1", "OK2"}) {
		t.Errorf("lab received %v, want OK1, OK2 (the failures dead-lettered, the lane moving on)", got)
	}
	want := map[string]string{
		"THROW": `javascript handler js: Error: no visit for this message (at ` + js + `:5:`,
		"LOOP":  `javascript handler js: timed out: still running after 300ms (at ` + js + `:7:`,
		"BAD":   `javascript handler js: bad result: transform returned a string`,
	}
	for id, w := range want {
		fixtures.Eventually(t, 10*time.Second, id+" dead-lettered", func() bool { return messageStatus(t, db, id) == pipeline.StatusError })
		reasons := queryStrings(t, db, `
			SELECT w.last_error FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
			WHERE m.control_id = $1 AND w.status = 'dead'`, id)
		if len(reasons) != 1 || !strings.HasPrefix(reasons[0], w) {
			t.Errorf("%s dead-lettered with %q, want it to start with %q", id, reasons, w)
		}
		if strings.Contains(strings.Join(reasons, ""), "SECRET") || strings.Contains(strings.Join(reasons, ""), "DOE") {
			t.Errorf("%s: the reason carries message content: %q", id, reasons)
		}
	}
}

func TestScriptOnErrorHoldWaitsAtTheMessage(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	lab := newPartner(t, "", nil)
	// A message needs the clinic's opening registered in state first.
	js := writeScript(t, dir, "adt.js", `
function transform(msg, ctx) {
  if (!ctx.state.get("clinic", "open")) throw new Error("the clinic is not open yet for " + msg.get("PID-5.1"));
}`)
	listen, otherListen := fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	yaml := strings.Replace(oneChannel(listen, js, ", on_error: hold", map[string]string{"lab": lab.addr}), "handlers:", fmt.Sprintf(`  other:
    inbound: {mllp: {listen: %q}}
    routes: [{name: out, destinations: [lab]}]
handlers:`, otherListen), 1)
	cfg := loadConfig(t, dir, yaml)
	// The script's error quotes the patient: the node's log must not.
	logs := &fixtures.SyncBuffer{}
	cluster.StartNode(t, db, cfg, func(o *engine.Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})

	send(t, listen, adt("H1", "P1"), adt("H2", "P2"))
	fixtures.Eventually(t, 20*time.Second, "H1 held with its reason", func() bool {
		var attempts int
		var reason *string
		err := db.Pool.QueryRow(context.Background(), `
			SELECT w.attempts, w.last_error FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
			WHERE m.control_id = 'H1' AND w.stage = 'routed'`).Scan(&attempts, &reason)
		return err == nil && attempts >= 2 && reason != nil && strings.Contains(*reason, "the clinic is not open yet")
	})
	if got := lab.acceptedIDs(); len(got) != 0 {
		t.Fatalf("lab received %v while the lane is held", got)
	}
	if text := logs.String(); !strings.Contains(text, "lane held") || strings.Contains(text, "DOE") {
		t.Fatalf("the node's log of the held lane must name the hold but not the patient the script's error quotes:\n%s", text)
	}
	if dead := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); dead != 0 {
		t.Fatalf("%d rows dead-lettered under on_error: hold", dead)
	}
	if st := messageStatus(t, db, "H2"); st != pipeline.StatusRouted {
		t.Fatalf("H2 is %s, want routed, waiting behind H1", st)
	}
	// Another channel's lanes are not held.
	send(t, otherListen, adt("O1", "P9"))
	fixtures.Eventually(t, 20*time.Second, "the other channel's message delivered", func() bool { return len(lab.acceptedIDs()) == 1 })

	// What H1 waits for is written elsewhere (another node; here straight
	// to the table): the held message reads it at its next try.
	if _, err := db.Pool.Exec(context.Background(), `
		INSERT INTO mefor_state (namespace, key, value, version) VALUES ('clinic', 'open', 'true', nextval('mefor_state_version'))`); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "H1 and H2 delivered", func() bool { return len(lab.acceptedIDs()) == 3 })
	if got := lab.acceptedIDs(); !slices.Equal(got, []string{"O1", "H1", "H2"}) {
		t.Errorf("lab received %v, want O1, then H1, H2 in order", got)
	}
}

// counterScript increments one shared counter per message and writes the
// count it saw into ZVC-1.
const counterScript = `
function transform(msg, ctx) {
  var n = (ctx.state.get("test", "counter") || 0) + 1;
  ctx.state.set("test", "counter", n);
  msg.set("ZVC-1", n);
}`

// Two channels, each its own lanes, on two nodes, read-modify-write one
// counter. Every message sees a count no other message saw, and the
// counter ends at the number of messages: no update is lost, none applied
// twice.
func TestScriptStateNoLostUpdateAcrossLanesAndNodes(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	lab := newPartner(t, "", nil)
	js := writeScript(t, dir, "count.js", counterScript)
	listenA, listenB := fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	yaml := fmt.Sprintf(`
cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  a:
    inbound: {mllp: {listen: %q}}
    routes: [{name: out, handler: count, destinations: [lab]}]
  b:
    inbound: {mllp: {listen: %q}}
    routes: [{name: out, handler: count, destinations: [lab]}]
handlers:
  count: {type: javascript, javascript: {file: %q}}
destinations:
  lab: {type: mllp, mllp: {address: %q}, ordering: {mode: parallel, lanes: 4}}
`, listenA, listenB, js, lab.addr)
	cfg := loadConfig(t, dir, yaml)
	n1 := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = t.Name() + "-1" })
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = t.Name() + "-2" })
	fixtures.Eventually(t, 20*time.Second, "a listener holder", func() bool { return n1.Lease().Serving() || len(n1.ListenerAddrs()) == 0 })

	const each = 1000
	var wg sync.WaitGroup
	for _, ch := range []string{"a", "b"} {
		wg.Go(func() {
			var msgs [][]byte
			for i := range each {
				msgs = append(msgs, adt(fmt.Sprintf("%s%04d", ch, i), "P1"))
			}
			addr := listenA
			if ch == "b" {
				addr = listenB
			}
			sendEventually(t, addr, msgs)
		})
	}
	wg.Wait()
	fixtures.Eventually(t, 3*time.Minute, "every message delivered", func() bool { return len(lab.acceptedIDs()) >= 2*each })

	counts := fields(lab.messages(t), "ZVC-1")
	seen := map[string]bool{}
	for _, c := range counts {
		if seen[c] {
			t.Fatalf("two messages saw count %s: an update was lost", c)
		}
		seen[c] = true
	}
	row, ok, err := pipeline.ReadState(context.Background(), db.Pool, nil, "test", "counter")
	if err != nil || !ok {
		t.Fatalf("counter: %v, %v", ok, err)
	}
	if string(row.Value) != strconv.Itoa(2*each) {
		t.Errorf("counter ends at %s, want %d", row.Value, 2*each)
	}
	t.Logf("routed drainers ran on nodes: %v", queryStrings(t, db,
		`SELECT DISTINCT unnest(attempted_by) FROM river_job WHERE kind = 'mefor_routed'`))
}

// sendEventually sends msgs in order over one connection, waiting for the
// channel's listener to be bound on whichever node holds the lease.
func sendEventually(t *testing.T, addr string, msgs [][]byte) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := sendOne(addr, msgs[0])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no listener on %s: %v", addr, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	send(t, addr, msgs[1:]...)
}

// A value written elsewhere (another node, seen here as a write straight
// to the table) is what the next transform reads, even though this node's
// cache holds the older value.
func TestScriptStateReadsTheLastCommittedWrite(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, lab, listen, _ := startScript(t, db, t.TempDir(), "count.js", counterScript, "", nil)

	send(t, listen, adt("C1", "P1"))
	fixtures.Eventually(t, 20*time.Second, "C1 delivered", func() bool { return len(lab.acceptedIDs()) == 1 })
	if _, err := db.Pool.Exec(context.Background(), `
		UPDATE mefor_state SET value = '41', version = nextval('mefor_state_version') WHERE namespace = 'test' AND key = 'counter'`); err != nil {
		t.Fatal(err)
	}
	send(t, listen, adt("C2", "P1"))
	fixtures.Eventually(t, 20*time.Second, "C2 delivered", func() bool { return len(lab.acceptedIDs()) == 2 })
	if got := fields(lab.messages(t), "ZVC-1"); !slices.Equal(got, []string{"1", "42"}) {
		t.Errorf("counts %v, want 1 then 42 (the write made elsewhere, not this node's cached 1)", got)
	}
}

// A sealed state value copied from another key (or altered) never feeds a
// transform: the message that reads it is dead-lettered as tampered, as
// one whose own body is, and nothing of it is sent; the lane moves on, and
// once the value is removed the next message counts afresh. The node's log
// names the namespace, never the key (keys are often patient ids).
func TestScriptStateTamperedValueIsNeverUsed(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	kr := fixtures.Keyring(t, "k1")
	logs := &fixtures.SyncBuffer{}
	_, lab, listen, _ := startScript(t, db, t.TempDir(), "count.js", counterScript, "", func(o *engine.Options) {
		o.Keys = kr
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	ctx := context.Background()

	send(t, listen, adt("C1", "P1"))
	fixtures.Eventually(t, 20*time.Second, "C1 delivered", func() bool { return len(lab.acceptedIDs()) == 1 })
	// A superuser writes over the counter a value sealed for another key.
	copied := kr.Seal(pipeline.ColState, pipeline.StateValueRow(state.Key{Namespace: "test", Key: "other"}), []byte("41"))
	tag, err := db.Pool.Exec(ctx, `
		UPDATE mefor_state SET value = $1, version = nextval('mefor_state_version') WHERE namespace = 'test'`, copied)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rewrite the counter: %v (%d rows)", err, tag.RowsAffected())
	}

	send(t, listen, adt("C2", "P2"), adt("C3", "P3"))
	for _, id := range []string{"C2", "C3"} {
		fixtures.Eventually(t, 30*time.Second, id+" dead-lettered as tampered", func() bool {
			var status, lastErr string
			var msg int64
			err := db.Pool.QueryRow(ctx, `
				SELECT w.status, coalesce(w.last_error, ''), m.id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
				WHERE m.control_id = $1 AND w.stage = 'routed'`, id).Scan(&status, &lastErr, &msg)
			return err == nil && status == "dead" && strings.HasPrefix(pipeline.OpenText(kr, msg, lastErr), pipeline.TamperedPrefix)
		})
	}
	if got := lab.acceptedIDs(); len(got) != 1 {
		t.Fatalf("lab received %v; a message that read the tampered value was sent", got)
	}

	if _, err := db.Pool.Exec(ctx, `DELETE FROM mefor_state WHERE namespace = 'test'`); err != nil {
		t.Fatal(err)
	}
	send(t, listen, adt("C4", "P4"))
	fixtures.Eventually(t, 20*time.Second, "C4 delivered", func() bool { return len(lab.acceptedIDs()) == 2 })
	if got := fields(lab.messages(t), "ZVC-1"); !slices.Equal(got, []string{"1", "1"}) {
		t.Errorf("counts %v, want 1 then 1 (the tampered 41 never read)", got)
	}
	text := logs.String()
	if !strings.Contains(text, "dead-lettered as tampered") || strings.Contains(text, `"other"`) || strings.Contains(text, "counter") {
		t.Errorf("the node's log must report the tampered rows without the state key:\n%s", text)
	}
}

// A drainer that is superseded (its node froze and River rescued the job)
// while a transform has run leaves no state behind: its hand-off, state
// writes included, is rolled back, and the execution that replaces it
// applies the message's writes once.
func TestScriptStateExactlyOnceAcrossSupersededDrainer(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	// K1's first run takes a second and a half, leaving time to supersede
	// the drainer running it.
	node, lab, listen, _ := startScript(t, db, t.TempDir(), "count.js", `var slowed = false;
function transform(msg, ctx) {
  var n = (ctx.state.get("test", "counter") || 0) + 1;
  ctx.state.set("test", "counter", n);
  msg.set("ZVC-1", n);
  if (msg.get("MSH-10") === "K1" && !slowed) {
    slowed = true;
    var t0 = Date.now();
    while (Date.now() - t0 < 1500) {}
  }
}`, ", timeout: 10s", func(o *engine.Options) { o.ReclaimInterval = time.Hour })
	waitStartupReclaim(t, db)

	send(t, listen, adt("K1", "P1"))
	var jobID int64
	fixtures.Eventually(t, 20*time.Second, "K1's transform running", func() bool {
		err := db.Pool.QueryRow(context.Background(),
			`SELECT id FROM river_job WHERE kind = 'mefor_routed' AND state = 'running'`).Scan(&jobID)
		return err == nil && messageStatus(t, db, "K1") == pipeline.StatusRouted
	})
	time.Sleep(300 * time.Millisecond) // inside the slow run
	if _, err := db.Pool.Exec(context.Background(),
		`UPDATE river_job SET state = 'retryable', scheduled_at = now() + interval '1 hour' WHERE id = $1`, jobID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the superseded execution hands off, and is refused
	if _, ok, err := pipeline.ReadState(context.Background(), db.Pool, nil, "test", "counter"); err != nil || ok {
		t.Fatalf("the superseded execution left state behind (present %v, %v)", ok, err)
	}
	if got := lab.acceptedIDs(); len(got) != 0 {
		t.Fatalf("the superseded execution delivered %v", got)
	}

	if _, err := node.Client().JobRetry(context.Background(), jobID); err != nil {
		t.Fatal(err)
	}
	send(t, listen, adt("K2", "P1"))
	fixtures.Eventually(t, 30*time.Second, "K1 and K2 delivered", func() bool { return len(lab.acceptedIDs()) == 2 })
	if got := fields(lab.messages(t), "ZVC-1"); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("counts %v, want 1, 2: K1's writes applied once", got)
	}
	row, _, err := pipeline.ReadState(context.Background(), db.Pool, nil, "test", "counter")
	if err != nil || string(row.Value) != "2" {
		t.Errorf("counter %s (%v), want 2", row.Value, err)
	}
}

func TestScriptReload(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	node, lab, listen, js := startScript(t, db, dir, "adt.js", `function transform(msg) { msg.set("ZVC-1", "v1"); }`, "", nil)
	ctx := context.Background()

	send(t, listen, adt("R1", "P1"))
	fixtures.Eventually(t, 20*time.Second, "R1 delivered", func() bool { return len(lab.acceptedIDs()) == 1 })

	// Only the script changes: the reload picks it up.
	writeScript(t, dir, "adt.js", `function transform(msg) { msg.set("ZVC-1", "v2"); }`)
	res, err := node.Reload(ctx)
	if err != nil || !res.Changed {
		t.Fatalf("reload of a changed script: %+v, %v", res, err)
	}
	send(t, listen, adt("R2", "P1"))
	fixtures.Eventually(t, 20*time.Second, "R2 delivered", func() bool { return len(lab.acceptedIDs()) == 2 })

	// A script that does not compile refuses the reload and changes nothing.
	writeScript(t, dir, "adt.js", "function transform(msg) {\n  msg.set(\"ZVC-1\", \"v3\";\n}")
	if _, err := node.Reload(ctx); err == nil || !strings.Contains(err.Error(), js+":2:") || !strings.Contains(err.Error(), "SyntaxError") {
		t.Fatalf("reload of a broken script: %v, want a SyntaxError at %s:2", err, js)
	}
	send(t, listen, adt("R3", "P1"))
	fixtures.Eventually(t, 20*time.Second, "R3 delivered", func() bool { return len(lab.acceptedIDs()) == 3 })
	if got := fields(lab.messages(t), "ZVC-1"); !slices.Equal(got, []string{"v1", "v2", "v2"}) {
		t.Errorf("ZVC-1 %v, want v1, v2, v2", got)
	}
}

// A lookup through a reference set from a script, with the set synced from
// a CSV file.
func TestScriptLookup(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	lab := newPartner(t, "", nil)
	csv := writeScript(t, dir, "sex.csv", "code,label\nF,female\nM,male\n")
	js := writeScript(t, dir, "adt.js", `function transform(msg, ctx) {
  msg.set("PID-8", ctx.lookup("sex", msg.get("PID-8")) || "unknown");
}`)
	listen := fixtures.FreeAddr(t)
	yaml := oneChannel(listen, js, "", map[string]string{"lab": lab.addr}) + fmt.Sprintf(`
reference_sets:
  sex: {source: {csv: {path: %q}}}
`, csv)
	cluster.StartNode(t, db, loadConfig(t, dir, yaml), nil)
	send(t, listen, adt("L1", "P1"))
	fixtures.Eventually(t, 30*time.Second, "L1 delivered", func() bool { return len(lab.acceptedIDs()) == 1 })
	if got := fields(lab.messages(t), "PID-8"); got[0] != "female" {
		t.Errorf("PID-8 %q, want female", got[0])
	}
}
