package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/dryrun"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// These tests run the JavaScript handlers of examples/scripting: `mefor
// handler test` on its samples and against bad input, and the example run
// live as its README says.

// The example's walkthrough, as its README shows it: run from the root of
// the repository, on the example's samples.
func TestHandlerTestOnTheScriptingExample(t *testing.T) {
	t.Parallel()
	root, _ := filepath.Abs("../..")
	out, err := cluster.RunMefor(t, root, nil, "handler", "test", "--config", "examples/scripting/mefor.yaml", "to-lab",
		"examples/scripting/samples/adt.hl7")
	if err == nil {
		t.Fatalf("exit 0 although a sample fails:\n%s", out)
	}
	for _, want := range []string{
		"handler to-lab, as route adt/to-lab (lab)",
		"examples/scripting/samples/adt.hl7 #1: ADT^A01 ADT00001\n  output 1 of 1 → lab\n",
		"    ~ PID|1||GH00100001^^^GHLAB^MR||EVERYWOMAN",
		"    + ZVC|1\n  state visits/100001 = 1\n",
		"#2: ADT^A04 ADT00002\n  log info: test patient not sent to the lab; message 2\n  filtered: nothing is delivered\n",
		"    + ZVC|2\n  state visits/100001 = 2 (was 1)\n", // the second admission sees the first one's count
		"#5: ADT^A01 ADT00005\n  FAILED (a node dead-letters it): javascript handler to-lab: Error: ward code not in reference set wards",
		"(at ./examples/scripting/handlers/to-lab.js:27:",
		"5 messages: 3 delivered (3 output messages), 1 filtered, 1 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// handlerTestDir writes a config and a script, returning the directory.
func handlerTestDir(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"h.js": script,
		"mefor.yaml": `
channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:12575"}}
    routes:
      - {name: out, handler: split, destinations: [lab, archive]}
handlers:
  split: {type: javascript, javascript: {file: ./h.js}}
destinations:
  lab: {type: mllp, mllp: {address: "127.0.0.1:12576"}}
  archive: {type: file, file: {directory: ./out}}
`,
		"in.hl7": "MSH|^~\\&|A|B|C|D|20240101||ORM^O01|M1|P|2.5.1\rPID|1||123^^^H^MR\rORC|NW|1\rORC|NW|2\rNTE|1||x\r\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Splits, destination subsets, removed segments and seeded state, as JSON.
func TestHandlerTestJSON(t *testing.T) {
	t.Parallel()
	dir := handlerTestDir(t, `function transform(msg, ctx) {
  var n = ctx.state.get("orders", msg.get("PID-3.1")) || 0;
  var out = [];
  msg.remove("NTE");
  msg.segments("ORC").forEach(function (orc, i) {
    var c = msg.clone();
    c.remove(i === 0 ? "ORC(2)" : "ORC(1)");
    out.push({message: c, destinations: i === 0 ? ["lab"] : ["archive"]});
    n++;
  });
  ctx.state.set("orders", msg.get("PID-3.1"), n);
  ctx.state.delete("orders", "old");
  return out;
}`)
	out, err := cluster.RunMefor(t, dir, nil, "handler", "test", "--config", "mefor.yaml", "split", "in.hl7",
		"--state", `orders/123=40`, "--state", `orders/old={"a":1,"b":2}`, "--json")
	if err != nil {
		t.Fatalf("handler test: %v\n%s", err, out)
	}
	var rep dryrun.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Messages) != 1 {
		t.Fatalf("%d messages", len(rep.Messages))
	}
	m := rep.Messages[0]
	if m.Outcome != "delivered" || len(m.Outputs) != 2 {
		t.Fatalf("result %+v", m)
	}
	if got := strings.Join(m.Outputs[0].Destinations, ","); got != "lab" {
		t.Errorf("first output to %s", got)
	}
	if got := strings.Join(m.Outputs[1].Destinations, ","); got != "archive" {
		t.Errorf("second output to %s", got)
	}
	if got := strings.Join(m.Outputs[0].Segments, "\n"); got != "MSH|^~\\&|A|B|C|D|20240101||ORM^O01|M1|P|2.5.1\nPID|1||123^^^H^MR\nORC|NW|1" {
		t.Errorf("first output segments:\n%s", got)
	}
	writes, _ := json.Marshal(m.StateWrites)
	if want := `[{"namespace":"orders","key":"123","value":42,"previous":40},{"namespace":"orders","key":"old","value":null,"previous":{"a":1,"b":2}}]`; string(writes) != want {
		t.Errorf("state writes %s, want %s", writes, want)
	}
}

// A script with a syntax error is reported with its file and line, and so
// is a bad --state flag; neither runs anything.
func TestHandlerTestRefusesBadInput(t *testing.T) {
	t.Parallel()
	dir := handlerTestDir(t, "function transform(msg) {\n  msg.set(\"PID-3\", ;\n}")
	var stdout, stderr bytes.Buffer
	code := run([]string{"handler", "test", "--config", filepath.Join(dir, "mefor.yaml"), "split", filepath.Join(dir, "in.hl7")}, &stdout, &stderr)
	// The script path in the config is relative to the working directory,
	// which is not dir here: the error says where it looked.
	if code != 1 || !strings.Contains(stderr.String(), "./h.js cannot be read") || !strings.Contains(stderr.String(), "working directory") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr.String())
	}

	out, err := cluster.RunMefor(t, dir, nil, "handler", "test", "--config", "mefor.yaml", "split", "in.hl7")
	if err == nil || !strings.Contains(out, `mefor.yaml:8: handler "split": javascript.file ./h.js:2:20: SyntaxError: Unexpected token ;`) {
		t.Errorf("syntax error: %v\n%s", err, out)
	}
	out, err = cluster.RunMefor(t, dir, nil, "config", "check", "mefor.yaml")
	if err == nil || !strings.Contains(out, "./h.js:2:20: SyntaxError") {
		t.Errorf("config check of a broken script: %v\n%s", err, out)
	}

	dir = handlerTestDir(t, "function transform() {}")
	for _, bad := range []string{"orders=1", "orders/k=notjson"} {
		out, err := cluster.RunMefor(t, dir, nil, "handler", "test", "--config", "mefor.yaml", "split", "in.hl7", "--state", bad)
		if err == nil || !strings.Contains(out, "--state") {
			t.Errorf("--state %s: %v\n%s", bad, err, out)
		}
	}
	out, err = cluster.RunMefor(t, dir, nil, "handler", "test", "--config", "mefor.yaml", "nosuch", "in.hl7")
	if err == nil || !strings.Contains(out, `mefor.yaml (handlers: split, passthrough)`) {
		t.Errorf("unknown handler: %v\n%s", err, out)
	}
}

// The live run of examples/scripting/README.md: the example's config (its
// ports replaced by free ones), run from the root of the repository as the
// README says, its samples sent, the lab's messages checked.
func TestScriptingExampleEndToEnd(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	root, _ := filepath.Abs("../..")
	dir := t.TempDir()
	env := []string{"DATABASE_URL=" + db.URL}
	listen, lab := fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	src, err := os.ReadFile(filepath.Join(root, "examples/scripting/mefor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(strings.ReplaceAll(string(src), "127.0.0.1:2575", listen), "127.0.0.1:2576", lab)
	if cfg == string(src) {
		t.Fatal("the example no longer uses ports 2575/2576; update this test")
	}
	cfgPath := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	sinkDir := filepath.Join(dir, "lab")
	cluster.StartProc(t, root, env, "sink", "--listen", lab, "--dir", sinkDir, "--quiet")
	cluster.StartProc(t, root, env, "run", "--migrate", "--config", cfgPath, "--node-id", "scripting", "--admin-listen", "")
	cluster.WaitListening(t, lab)
	cluster.WaitListening(t, listen)

	if out, err := cluster.RunMefor(t, root, env, "send", "--to", listen, "examples/scripting/samples/adt.hl7"); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	cluster.Eventually(t, 30*time.Second, "3 messages at the lab", func() bool { return len(controlIDsInDir(t, sinkDir)) == 3 })
	if got := controlIDsInDir(t, sinkDir); !slices.Equal(got, []string{"ADT00001", "ADT00003", "ADT00004"}) {
		t.Fatalf("the lab received %v, want ADT00001, ADT00003, ADT00004 (the test patient filtered, the unknown ward dead)", got)
	}
	files, _ := filepath.Glob(filepath.Join(sinkDir, "*ADT00004*"))
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	m, err := hl7.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if m.Get("PID-3") != "GH00100001^^^GHLAB^MR" || m.Get("PV1-3.1") != "LAB-4SOUTH" || m.Get("ZVC-1") != "2" {
		t.Errorf("ADT00004 at the lab: PID-3 %q, PV1-3.1 %q, ZVC-1 %q; want GH00100001^^^GHLAB^MR, LAB-4SOUTH, 2",
			m.Get("PID-3"), m.Get("PV1-3.1"), m.Get("ZVC-1"))
	}

	cluster.Eventually(t, 20*time.Second, "ADT00005 dead-lettered", func() bool {
		out, _ := cluster.RunMefor(t, root, env, "dead", "list")
		return strings.Contains(out, "ward code not in reference set wards") && strings.Contains(out, "to-lab.js:27:")
	})
	out, err := cluster.RunMefor(t, root, env, "messages", "list")
	if err != nil || !strings.Contains(out, "filtered") {
		t.Errorf("messages list shows no filtered message: %v\n%s", err, out)
	}
}
