package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func reloadConfigYAML(listen, dest string) string {
	return fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound:
      mllp: {listen: %q}
    routes:
      - name: out
        destinations: [down]
destinations:
  down:
    type: mllp
    mllp: {address: %q}
`, listen, dest)
}

func unusedAddr(t *testing.T) string {
	t.Helper()
	return fixtures.FreeAddr(t)
}

// inProcessNode runs an engine node on path until the test ends.
func inProcessNode(t *testing.T, db *testcontainers.DB, id, path string) *engine.Node {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.Start(t, engine.Options{Config: cfg, Pool: db.Pool, NodeID: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func reloadCLI(t *testing.T, db *testcontainers.DB, args ...string) (reloadResult, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"reload", "--json", "--database-url", db.URL}, args...), &out, &errb)
	var res reloadResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("reload %v: exit %d, output is not JSON: %v\nstdout: %s\nstderr: %s", args, code, err, out.String(), errb.String())
	}
	return res, code, errb.String()
}

func nodeStates(w *ops.ConfigWait) map[string]ops.NodeReload {
	out := map[string]ops.NodeReload{}
	if w != nil {
		for _, n := range w.Nodes {
			out[n.Node] = n
		}
	}
	return out
}

// `mefor reload` converges two nodes, rejects a bad file without touching
// either (exit 1), and says which node did not apply a good file and why
// (exit 3).
func TestReloadCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	// Same file on both nodes; only the lease holder binds the listener.
	listen := unusedAddr(t)
	pathA, pathB := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	v1, v2 := reloadConfigYAML(listen, "127.0.0.1:1"), reloadConfigYAML(listen, "127.0.0.1:2")
	write(pathA, v1)
	write(pathB, v1)
	a := inProcessNode(t, db, "a", pathA)
	b := inProcessNode(t, db, "b", pathB)

	// A good file: both nodes apply it.
	write(pathA, v2)
	write(pathB, v2)
	res, code, stderr := reloadCLI(t, db, "--config", pathA)
	if code != 0 || !res.OK || res.Version != 1 || res.Wait == nil || !res.Wait.Converged {
		t.Fatalf("reload of a good file: exit %d, %+v, stderr %s; want exit 0, version 1, converged", code, res, stderr)
	}
	for _, id := range []string{"a", "b"} {
		if st := nodeStates(res.Wait)[id]; st.State != ops.ReloadApplied {
			t.Errorf("node %s: %+v, want applied", id, st)
		}
	}
	good := res.Hash
	if a.Config().Hash() != good || b.Config().Hash() != good {
		t.Fatal("a converged reload left a node on its old config")
	}

	// A bad file: rejected before anything is announced.
	bad := strings.Replace(v2, "type: mllp", "type: carrier-pigeon", 1)
	write(pathA, bad)
	write(pathB, bad)
	res, code, _ = reloadCLI(t, db, "--config", pathA)
	if code != exitReloadRejected || res.OK || len(res.Errors) == 0 || res.Errors[0].File != pathA || res.Errors[0].Line == 0 {
		t.Fatalf("reload of a bad file: exit %d, %+v; want exit %d with file:line errors", code, res, exitReloadRejected)
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat: a node would have reacted to a bump
	cc, err := leader.ReadClusterConfig(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if cc.Version != 1 || a.Config().Hash() != good || b.Config().Hash() != good {
		t.Fatalf("a rejected file changed something: cluster version %d, hashes %s %s", cc.Version, a.Config().Hash()[:12], b.Config().Hash()[:12])
	}

	// A good file here, a bad copy on node b: announced, not converged.
	v3 := reloadConfigYAML(listen, "127.0.0.1:3")
	write(pathA, v3)
	res, code, _ = reloadCLI(t, db, "--config", pathA, "--timeout", "15s")
	st := nodeStates(res.Wait)
	if code != exitReloadNotConverged || res.Wait == nil || res.Wait.Converged ||
		st["a"].State != ops.ReloadApplied || st["b"].State != ops.ReloadFailed || !strings.Contains(st["b"].Reason, pathB) {
		t.Fatalf("reload with a bad copy on b: exit %d, %+v; want exit %d, a applied, b failed naming %s",
			code, res.Wait, exitReloadNotConverged, pathB)
	}
	if b.Config().Hash() != good {
		t.Error("node b left its config for a bad file")
	}

	// The status command shows b behind, with its reason.
	out := runOK(t, "status", "--database-url", db.URL)
	var bLine string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "b ") {
			bLine = line
		}
	}
	if !strings.Contains(bLine, "behind") || !strings.Contains(bLine, "file differs") || !strings.Contains(bLine, "failed") {
		t.Errorf("status line of node b = %q, want behind, file differs and the failure\n%s", bLine, out)
	}
}
