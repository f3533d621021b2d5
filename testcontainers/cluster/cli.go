package cluster

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/mefor/mefor/ops"
)

// NodesJSON runs `mefor nodes --json` and fails the test when it shows
// more than one lease holder.
func (c *Cluster) NodesJSON() []ops.Node {
	c.t.Helper()
	out, err := RunMefor(c.t, c.Dir, c.Env(c.DB.URL), "nodes", "--json")
	if err != nil {
		c.t.Fatalf("mefor nodes --json: %v\n%s", err, out)
	}
	var rows []ops.Node
	if err := json.Unmarshal([]byte(JSONPart(out)), &rows); err != nil {
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

// HolderPerNodes is the node `mefor nodes` shows holding the lease ("" if none).
func (c *Cluster) HolderPerNodes() (holder, riverLeader string) {
	for _, r := range c.NodesJSON() {
		if r.HoldsLease {
			holder = r.ID
		}
		if r.RiverLeader {
			riverLeader = r.ID
		}
	}
	return holder, riverLeader
}

// StepdownResult is the answer of `mefor stepdown --json`.
type StepdownResult struct {
	Outcome    string     `json:"outcome"`
	Node       string     `json:"node"`
	WasHolder  bool       `json:"was_holder"`
	ReleasedAt *time.Time `json:"released_at"`
	Holder     string     `json:"holder"`
	NewHolder  string     `json:"new_holder"`
}

// Stepdown runs `mefor stepdown ARGS --json` and returns its answer and exit
// code.
func (c *Cluster) Stepdown(args ...string) (StepdownResult, int, string) {
	c.t.Helper()
	cmd := exec.Command(Binary(c.t), append([]string{"stepdown", "--json"}, args...)...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.Env(c.DB.URL)...)
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
	var r StepdownResult
	if err := json.Unmarshal([]byte(JSONPart(stdout.String())), &r); err != nil {
		c.t.Fatalf("mefor stepdown %v (exit %d): output is not JSON: %v\n%s", args, code, err, all)
	}
	return r, code, all
}

// JSONPart drops anything before the first JSON value (a log line or a
// warning on the same stream).
func JSONPart(s string) string {
	if i := strings.IndexAny(s, "[{"); i > 0 {
		return s[i:]
	}
	return s
}
