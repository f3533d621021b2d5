package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/testcontainers"
)

// An egress list that leaves out a destination is an error of `mefor
// config check` naming the file, line, destination and fix, and `mefor
// reload` refuses the file: the nodes keep their config. `mefor status`
// says egress: unrestricted before, and the list once a good file is
// reloaded.
func TestEgressConfigCheckReloadAndStatus(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	path := filepath.Join(t.TempDir(), "mefor.yaml")
	listen := unusedAddr(t)
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := reloadConfigYAML(listen, "127.0.0.1:1")
	write(base)
	n := inProcessNode(t, db, "a", path)
	status := func() string { return runOK(t, "status", "--database-url", db.URL) }
	if out := status(); !strings.Contains(out, "egress: unrestricted") {
		t.Fatalf("status without an egress: section:\n%s", out)
	}

	write("egress: {allow: [10.0.0.0/8]}\n" + base)
	var out, errb bytes.Buffer
	code := run([]string{"config", "check", "--no-tls-files", path}, &out, &errb)
	want := path + `:13: destination "down": mllp.address 127.0.0.1:1 is not in egress.allow, so mefor may not connect to it; add "127.0.0.1:1"`
	if code != 1 || !strings.Contains(out.String(), want) {
		t.Fatalf("config check: exit %d\n%s\nwant a line starting %q", code, out.String(), want)
	}
	res, code, _ := reloadCLI(t, db, "--config", path)
	if code != exitReloadRejected || res.OK || len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Message, "not in egress.allow") {
		t.Fatalf("reload: exit %d, %+v; want it refused for the destination outside egress.allow", code, res)
	}
	if n.Config().Egress != nil || n.AppliedConfigVersion() != 0 {
		t.Fatal("a refused file reached the node")
	}

	write("egress: {allow: [127.0.0.1]}\n" + base)
	out.Reset()
	if code := run([]string{"config", "check", "--no-tls-files", path}, &out, &errb); code != 0 || !strings.Contains(out.String(), "egress: 1 entry (127.0.0.1)") {
		t.Fatalf("config check of a good file: exit %d\n%s", code, out.String())
	}
	if res, code, _ := reloadCLI(t, db, "--config", path); code != 0 || !res.OK {
		t.Fatalf("reload of a good file: exit %d, %+v", code, res)
	}
	if out := status(); !strings.Contains(out, "egress: 1 entry (127.0.0.1)") {
		t.Fatalf("status after the reload:\n%s", out)
	}
}

func TestPrintEgress(t *testing.T) {
	var b bytes.Buffer
	printEgress(&b, &nodeinfo.EgressStatus{Policies: []nodeinfo.EgressInUse{
		{NodeEgress: nodeinfo.NodeEgress{Restricted: true, Allow: []string{"lab.example.org:2575", "10.20.0.0/16"},
			Plaintext: []nodeinfo.PlaintextOutbound{{Target: "destination:lab", Address: "lab.example.org:2575", Protocol: "mllp"}}},
			Nodes: []string{"a"}},
		{NodeEgress: nodeinfo.NodeEgress{Restricted: false, Allow: []string{},
			Plaintext: []nodeinfo.PlaintextOutbound{{Target: "destination:lab", Address: "lab.example.org:2575", Protocol: "mllp"},
				{Target: "alert_sink:ops", Address: "hooks.example.org:80", Protocol: "http"}}},
			Nodes: []string{"b"}},
	}})
	out := b.String()
	for _, want := range []string{
		"warning: egress differs between nodes (a: 2 entries (lab.example.org:2575, 10.20.0.0/16); b: unrestricted",
		"warning: destination:lab sends plaintext MLLP to lab.example.org:2575, another machine (nodes a, b): add a tls: block",
		"warning: alert_sink:ops sends plaintext HTTP to hooks.example.org:80, another machine (nodes b): use https://",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
