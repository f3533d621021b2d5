package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go/exec"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
)

// These tests hold the CLI and the node to what encryption promises: keys
// named by the config and never printed, no patient data in clear at rest,
// and a store without keys said to be plaintext.

// newKeySpec returns "id=base64(32 random bytes)".
func newKeySpec(t *testing.T, id string) string {
	t.Helper()
	b := make([]byte, crypt.KeySize)
	rand.Read(b)
	return id + "=" + base64.StdEncoding.EncodeToString(b)
}

// envWith is a lookupEnv that has MEFOR_ENCRYPTION_KEYS=keys ("" unset).
func envWith(keys string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if name == crypt.EnvKeys {
			return keys, keys != ""
		}
		return os.LookupEnv(name)
	}
}

// cli runs mefor in-process with its own MEFOR_ENCRYPTION_KEYS.
func cli(t *testing.T, dbURL, keys string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runEnv(append(args, "--database-url", dbURL), &out, &errb, envWith(keys))
	return code, out.String(), errb.String()
}

// replyingPartner is a downstream system over real MLLP whose ACK text
// quotes the patient (MSA-3), as some partners' do: the reply is content.
type replyingPartner struct {
	addr string
	mu   sync.Mutex
	got  [][]byte
}

func newReplyingPartner(t *testing.T) *replyingPartner {
	t.Helper()
	return newReplyingPartnerAt(t, "127.0.0.1:0")
}

func newReplyingPartnerAt(t *testing.T, addr string) *replyingPartner {
	t.Helper()
	p := &replyingPartner{}
	p.addr = cluster.ServeMLLP(t, addr, func(_ context.Context, msg *hl7.Message) []byte {
		p.mu.Lock()
		p.got = append(p.got, msg.Encode()) // Parse then Encode is byte for byte
		p.mu.Unlock()
		return cluster.ACK(msg, hl7.AckAccept, "filed for "+msg.Get("PID-5.1")+" "+msg.Get("PID-3.1"))
	})
	return p
}

func (p *replyingPartner) received() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.got...)
}

var nodeSeq atomic.Int64

// The patients of the traffic: what must never be found at rest in clear.
var phiPatients = []struct{ id, name string }{
	{"PX918273", "ZEBRAFISH^JANE"},
	{"PX555001", "QUOKKA^JOHN"},
	{"PXFAIL42", "NARWHAL^ANN"}, // the script fails on this one, quoting it
}

func phiMessage(controlID, id, name string) []byte {
	return []byte("MSH|^~\\&|REG|HOSP|MEFOR|MEFOR|20240102081500||ADT^A01^ADT_A01|" + controlID + "|P|2.5.1\r" +
		"PID|1||" + id + "^^^HOSP^MR||" + name + "||19800101|F\r" +
		"PV1|1|I|3N^301^A\r")
}

// phiScript reshapes the message, keeps the last patient of each ward and
// each patient's visit count (keyed by the patient id, as scripts do) in
// transform state, translates the ward through a reference set, and fails
// on one patient with an error that quotes them.
const phiScript = `function transform(msg, ctx) {
  var id = msg.get("PID-3.1"), name = msg.get("PID-5");
  if (id === "PXFAIL42") { throw new Error("cannot place " + name + " (" + id + ")"); }
  var ward = msg.get("PV1-3.1");
  var last = ctx.state.get("last-by-ward", ward);
  ctx.state.set("last-by-ward", ward, {patient: name, id: id});
  var visits = (ctx.state.get("visits", id) || 0) + 1;
  ctx.state.set("visits", id, visits);
  msg.set("PV1-3.1", ctx.lookup("wards", ward));
  msg.set("NTE-3", "previous " + (last ? last.patient : "none"));
  msg.set("ZVC-1", String(visits));
}`

// phiNode writes the config for the traffic and runs a node with keys on
// db until the test ends (or stop is called).
func phiNode(t *testing.T, db *testcontainers.DB, keys, listen, partner string) (stop func()) {
	t.Helper()
	stop, err := startPHINode(t, db, phiOpts{keys: keys, listen: listen, partner: partner})
	if err != nil {
		t.Fatal(err)
	}
	return stop
}

type phiOpts struct {
	keys, listen, partner string
	// log receives the node's log; nil discards it.
	log io.Writer
	// plain routes without the script and the reference set.
	plain bool
	// alerts, when set, is the config's alerts: section.
	alerts string
}

func startPHINode(t *testing.T, db *testcontainers.DB, o phiOpts) (stop func(), err error) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	script := write("ward.js", phiScript)
	wards := write("wards.csv", "ward,lab_location\n3N,LAB-3NORTH\n")
	route := "{name: out, handler: ward, destinations: [lab]}"
	extra := fmt.Sprintf(`handlers:
  ward: {type: javascript, javascript: {file: %q}}
reference_sets:
  wards: {refresh: 1h, source: {csv: {path: %q}}}
`, script, wards)
	if o.plain {
		route, extra = "{name: out, destinations: [lab]}", ""
	}
	extra += o.alerts
	file := write("mefor.yaml", fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [%s]
destinations:
  lab:
    type: mllp
    mllp: {address: %q}
    retry: {max_attempts: 0, backoff: 100ms, max_backoff: 500ms}
%s`, o.listen, route, o.partner, extra))
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := crypt.Parse(o.keys)
	if err != nil {
		t.Fatal(err)
	}
	if o.log == nil {
		o.log = io.Discard
	}
	n, err := engine.New(engine.Options{Config: cfg, Pool: db.Pool, NodeID: fmt.Sprintf("node-%s-%d", t.Name(), nodeSeq.Add(1)), Keys: kr,
		Logger: slog.New(slog.NewTextHandler(o.log, nil)), ReclaimInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		return nil, err
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = n.Stop(context.Background()) }) }
	t.Cleanup(stop)
	return stop, nil
}

func sendMLLP(t *testing.T, addr string, msgs ...[]byte) {
	t.Helper()
	c := &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second}
	defer c.Close()
	for i, m := range msgs {
		if _, err := c.Send(context.Background(), m); err != nil {
			t.Fatalf("send message %d: %v", i, err)
		}
	}
}

// pgDump returns `pg_dump --data-only` of db, run inside its container.
func pgDump(t *testing.T, db *testcontainers.DB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	var out []byte
	// The server listens on the URL's port inside the container when it
	// shares the host's network, else on 5432 behind a published port.
	for _, port := range []string{u.Port(), "5432"} {
		code, r, err := db.Server.Container().Exec(ctx,
			[]string{"env", "PGPASSWORD=" + pw, "pg_dump", "-h", "127.0.0.1", "-p", port, "-U", u.User.Username(),
				"--data-only", "-d", db.Name},
			exec.Multiplexed())
		if err != nil {
			t.Fatalf("pg_dump: %v", err)
		}
		out, _ = io.ReadAll(r)
		if code == 0 {
			return string(out)
		}
	}
	t.Fatalf("pg_dump failed: %s", out)
	return ""
}

// After traffic through a node with MEFOR_ENCRYPTION_KEYS set, a data-only
// dump of the database holds no patient name or identifier, in text or in
// hex; with the key, show --body, search, dead list and replay still work,
// and without it bodies are refused naming the key.
func TestNoPlaintextPatientDataAtRest(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	keys := newKeySpec(t, "k1")
	partner := newReplyingPartner(t)
	listen := unusedAddr(t)
	phiNode(t, db, keys, listen, partner.addr)

	var msgs [][]byte
	for i, p := range phiPatients {
		msgs = append(msgs, phiMessage(fmt.Sprintf("C%d", i+1), p.id, p.name))
	}
	// Not HL7 at all: stored as it came, with a parse error.
	msgs = append(msgs, []byte("GARBAGE WALRUS^TOM PX777\r"))
	sendMLLP(t, listen, msgs...)
	cluster.Poll(t, 30*time.Second, "two deliveries", func() bool { return len(partner.received()) == 2 })
	for _, got := range partner.received() {
		if !bytes.Contains(got, []byte("LAB-3NORTH")) || !(bytes.Contains(got, []byte("ZEBRAFISH")) || bytes.Contains(got, []byte("QUOKKA"))) {
			t.Fatalf("partner got a message that is not the transformed original:\n%q", got)
		}
	}
	if !bytes.Contains(partner.received()[1], []byte("previous ZEBRAFISH")) {
		t.Fatalf("the second message does not carry the state the first left:\n%q", partner.received()[1])
	}
	// The failed message's error and the replies are written by then.
	cluster.Poll(t, 10*time.Second, "the dead letter", func() bool {
		_, out, _ := cli(t, db.URL, keys, "dead", "list")
		return strings.Contains(out, "NARWHAL")
	})

	dump := pgDump(t, db)
	if !strings.Contains(dump, "mefor_message") || !strings.Contains(dump, "mfe2") {
		t.Fatalf("the dump does not look like mefor's data:\n%.2000s", dump)
	}
	secrets := []string{"WALRUS", "PX777"}
	for _, p := range phiPatients {
		secrets = append(secrets, p.id, strings.Split(p.name, "^")[0])
	}
	for _, s := range secrets {
		for _, form := range []string{s, strings.ToLower(s), hex.EncodeToString([]byte(s))} {
			if i := strings.Index(dump, form); i >= 0 {
				t.Errorf("the dump holds %q (as %q) in clear: ...%s...", s, form, dump[max(0, i-200):min(len(dump), i+100)])
			}
		}
	}

	// With the key: everything reads.
	code, out, errs := cli(t, db.URL, keys, "messages", "show", "1", "--body")
	if code != 0 || !strings.Contains(out, "ZEBRAFISH^JANE") || !strings.Contains(out, "filed for ZEBRAFISH") {
		t.Fatalf("show --body with the key: exit %d\n%s%s", code, out, errs)
	}
	if code, out, _ := cli(t, db.URL, keys, "messages", "list", "--patient", "PX555001"); code != 0 || strings.Count(out, "C2") != 1 {
		t.Fatalf("list --patient with the key: exit %d\n%s", code, out)
	}
	if code, out, _ := cli(t, db.URL, keys, "messages", "list", "--text", "QUOKKA"); code != 0 || !strings.Contains(out, "C2") || strings.Contains(out, "C1") {
		t.Fatalf("list --text with the key: exit %d\n%s", code, out)
	}
	if code, out, _ := cli(t, db.URL, keys, "messages", "show", "4", "--body"); code != 0 || !strings.Contains(out, "GARBAGE WALRUS") {
		t.Fatalf("show --body of the unparsed message: exit %d\n%s", code, out)
	}
	if code, out, errs := cli(t, db.URL, keys, "replay", "2"); code != 0 {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errs)
	}
	cluster.Poll(t, 30*time.Second, "the replayed delivery", func() bool { return len(partner.received()) == 3 })
	if got := partner.received()[2]; !bytes.Equal(got, partner.received()[1]) {
		t.Fatalf("the replay sent something else:\n%q\nfirst time:\n%q", got, partner.received()[1])
	}

	// Without it: bodies are refused naming the key; the rest still shows.
	code, out, errs = cli(t, db.URL, "", "messages", "show", "1", "--body")
	if code == 0 || !strings.Contains(errs, `key "k1"`) || strings.Contains(out+errs, "mfe1") {
		t.Fatalf("show --body without the key: exit %d\n%s%s", code, out, errs)
	}
	if code, out, _ := cli(t, db.URL, "", "dead", "list"); code != 0 || !strings.Contains(out, "encrypted under key k1") {
		t.Fatalf("dead list without the key: exit %d\n%s", code, out)
	}
	if code, out, _ := cli(t, db.URL, "", "status"); code != 0 || !strings.Contains(out, "encryption at rest: on, active key k1") ||
		!strings.Contains(out, "not set for this command") {
		t.Fatalf("status without the key: exit %d\n%s", code, out)
	}
}

// Without keys mefor stores content in plaintext, as before, and status
// says so.
func TestWithoutKeysStatusSaysPlaintext(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	partner := newReplyingPartner(t)
	listen := unusedAddr(t)
	phiNode(t, db, "", listen, partner.addr)
	sendMLLP(t, listen, phiMessage("C1", "PX918273", "ZEBRAFISH^JANE"))
	cluster.Poll(t, 30*time.Second, "the delivery", func() bool { return len(partner.received()) == 1 })
	if code, out, _ := cli(t, db.URL, "", "status"); code != 0 || !strings.Contains(out, "encryption at rest: off: message content is stored in plaintext") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if dump := pgDump(t, db); !strings.Contains(dump, hex.EncodeToString([]byte("ZEBRAFISH"))) {
		t.Fatal("without keys the body should be stored as it came")
	}
}

// writeEncConfig writes a one-channel config whose encryption: section
// names keysRef.
func writeEncConfig(t *testing.T, keysRef string) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(p, []byte(`channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: `+filepath.Join(dir, "out")+`}}
encryption:
  keys: "`+keysRef+`"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A config that names the keys through ${...} seals with them: a message
// enqueued with the config is stored sealed under the variable's key, and
// `messages show --body` given the same keys opens it.
func TestConfigNamesEncryptionKeys(t *testing.T) {
	db := testcontainers.NewDB(t)
	spec := newKeySpec(t, "cfg1")
	t.Setenv("MEFOR_KEYS", spec)
	cfg := writeEncConfig(t, "${MEFOR_KEYS}")
	msg := filepath.Join(t.TempDir(), "adt.hl7")
	if err := os.WriteFile(msg, phiMessage("ENC1", "MRN4711", "WALRUS^GARBAGE"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errs := cli(t, db.URL, "", "config", "check", cfg)
	if code != 0 || !strings.Contains(out, "encryption at rest: keys from ${MEFOR_KEYS}: keyring (active cfg1; keys cfg1)") {
		t.Fatalf("config check: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli(t, db.URL, "", "enqueue", "--channel", "adt", "--config", cfg, msg); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s%s", code, out, errs)
	}
	var raw []byte
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT id, raw FROM mefor_message`).Scan(&id, &raw); err != nil {
		t.Fatal(err)
	}
	if id, ok := crypt.Sealed(raw); !ok || id != "cfg1" || bytes.Contains(raw, []byte("WALRUS")) {
		t.Fatalf("stored raw body is not sealed under cfg1 (sealed %v, key %q)", ok, id)
	}
	if code, out, errs := cli(t, db.URL, spec, "messages", "show", fmt.Sprint(id), "--body"); code != 0 || !strings.Contains(out, "WALRUS^GARBAGE") {
		t.Fatalf("show --body with the config's keys: exit %d\n%s%s", code, out, errs)
	}

	// MEFOR_ENCRYPTION_KEYS holding other keys than the config's variable
	// would split the data between two keyrings: refused, naming both
	// variables and the key ids only.
	other := newKeySpec(t, "env1")
	code, out, errs = cli(t, db.URL, other, "enqueue", "--channel", "adt", "--config", cfg, msg)
	if code != 1 || !strings.Contains(errs, "encryption.keys reads ${MEFOR_KEYS}") || !strings.Contains(errs, "MEFOR_ENCRYPTION_KEYS holds other keys") {
		t.Fatalf("enqueue with two keyrings: exit %d\n%s%s", code, out, errs)
	}
	for _, s := range []string{spec, other} {
		if _, key, _ := strings.Cut(s, "="); strings.Contains(out+errs, key) {
			t.Fatalf("the refusal shows a key:\n%s%s", out, errs)
		}
	}
	// The same keys in both is fine.
	if code, out, errs := cli(t, db.URL, spec, "enqueue", "--channel", "adt", "--config", cfg, msg); code != 0 {
		t.Fatalf("enqueue with the same keys in both variables: exit %d\n%s%s", code, out, errs)
	}
}

// A bad key named by the config stops config check and run with an error
// naming the file, the field and the fix; the key's bytes appear nowhere.
func TestConfigEncryptionBadKeyNeverPrinted(t *testing.T) {
	key := "c2hvcnQta2V5LW9mLTE2Yg==" // base64 of 16 bytes: the wrong length
	t.Setenv("MEFOR_KEYS", "k1="+key)
	cfg := writeEncConfig(t, "${MEFOR_KEYS}")
	for _, args := range [][]string{{"config", "check", cfg}, {"run", "--config", cfg}, {"config", "check", "--json", cfg}} {
		var stdout, stderr bytes.Buffer
		code := runEnv(args, &stdout, &stderr, envWith(""))
		all := stdout.String() + stderr.String()
		if code != 1 {
			t.Errorf("mefor %v: exit %d, want 1\n%s", args, code, all)
		}
		wants := []string{cfg + ":8:", "encryption.keys", `MEFOR_KEYS: entry 1 (key id "k1")`, "want 32", "head -c 32 /dev/urandom | base64"}
		if args[2] == "--json" {
			wants = []string{`"Line": 8`, `"Field": "encryption.keys"`, `MEFOR_KEYS: entry 1 (key id \"k1\")`, "want 32", "head -c 32 /dev/urandom | base64"}
		}
		for _, want := range wants {
			if !strings.Contains(all, want) {
				t.Errorf("mefor %v does not say %q:\n%s", args, want, all)
			}
		}
		for _, leak := range []string{key, strings.TrimRight(key, "="), "short-key-of-16b"} {
			if strings.Contains(all, leak) {
				t.Errorf("mefor %v prints the key:\n%s", args, all)
			}
		}
	}

	// A key written in the file itself is refused without quoting it.
	literal := writeEncConfig(t, "k1="+key)
	var stdout, stderr bytes.Buffer
	if code := runEnv([]string{"config", "check", literal}, &stdout, &stderr, envWith("")); code != 1 ||
		!strings.Contains(stdout.String(), "must be a reference to the environment variable") ||
		strings.Contains(stdout.String()+stderr.String(), key) {
		t.Errorf("a key in the file: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// No help text, error or log line shows a key: --help with the variable
// set, a malformed variable, and a node's start-up log.
func TestKeysNeverPrinted(t *testing.T) {
	key := newKeySpec(t, "k1")
	material := strings.TrimPrefix(key, "k1=")
	raw, _ := base64.StdEncoding.DecodeString(material)
	t.Setenv("MEFOR_ENCRYPTION_KEYS", key)
	leaks := func(what, out string) {
		t.Helper()
		for _, form := range []string{material, strings.TrimRight(material, "="), string(raw)} {
			if strings.Contains(out, form) {
				t.Fatalf("%s shows the key:\n%s", what, out)
			}
		}
	}

	var cmds [][]string
	cmds = append(cmds, []string{"--help"})
	for _, c := range []string{"run", "migrate", "keys", "keys status", "keys rotate", "audit", "audit verify",
		"messages show", "enqueue", "status", "replay", "cancel", "stepdown", "reload"} {
		cmds = append(cmds, append(strings.Fields(c), "--help"))
	}
	for _, args := range cmds {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		if code != 0 {
			t.Fatalf("mefor %v: exit %d\n%s", args, code, errb.String())
		}
		leaks("mefor "+strings.Join(args, " "), out.String()+errb.String())
	}
	var out, errb bytes.Buffer
	run([]string{"keys", "--help"}, &out, &errb)
	if !strings.Contains(out.String(), "head -c 32 /dev/urandom | base64") || !strings.Contains(out.String(), "keys rotate") {
		t.Fatalf("keys --help does not say how to make and rotate keys:\n%s", out.String())
	}

	// A malformed variable: each command that reads it stops, naming the
	// entry, never the key.
	short := base64.StdEncoding.EncodeToString(raw[:16])
	file := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(file, []byte(reloadConfigYAML(unusedAddr(t), unusedAddr(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"k1=" + short, material, "k1=" + material + ",k1=" + material} {
		for _, args := range [][]string{{"run", "--config", file}, {"status"}, {"messages", "show", "1", "--body"}, {"keys", "status"}} {
			var out, errb bytes.Buffer
			code := runEnv(append(args, "--database-url", "postgres://u:p@127.0.0.1:1/x"), &out, &errb, envWith(bad))
			msg := out.String() + errb.String()
			if code == 0 || !strings.Contains(msg, "MEFOR_ENCRYPTION_KEYS") {
				t.Fatalf("mefor %v with a bad key: exit %d\n%s", args, code, msg)
			}
			leaks("mefor "+strings.Join(args, " ")+" with a bad key", msg)
			leaks("mefor "+strings.Join(args, " ")+" with a bad key", strings.ReplaceAll(msg, "\n", ""))
			for _, form := range []string{short, strings.TrimRight(short, "=")} {
				if strings.Contains(msg, form) {
					t.Fatalf("mefor %v shows the short key:\n%s", args, msg)
				}
			}
		}
	}
}
