package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
