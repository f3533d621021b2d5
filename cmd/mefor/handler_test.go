package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/dryrun"
	"github.com/mefor/mefor/testcontainers/cluster"
)

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
