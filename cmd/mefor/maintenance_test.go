package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// An operator runs retention by hand against a running node, waits for it
// and reads the outcome; maintenance list then shows the run, and status the
// oldest body left.
func TestMaintenanceRunAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	file := filepath.Join(t.TempDir(), "mefor.yaml")
	yaml := fmt.Sprintf(`
channels:
  adt:
    inbound: {mllp: {listen: "%s"}}
    routes: [{destinations: [archive]}]
destinations:
  archive: {type: file, file: {directory: "%s"}}
maintenance:
  retention:
    schedule: "0 3 * * *"
    keep_bodies: 30d
    batch_size: 100
`, listen, t.TempDir())
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	cluster.Start(t, engine.Options{Config: cfg, Pool: db.Pool, NodeID: "node-1", ReclaimInterval: time.Hour})

	// 250 delivered messages received 40 days ago, 1 received today.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status, received_at)
		SELECT 'adt', 'test', 3, 'MSH', 'processed', now() - interval '40 days' FROM generate_series(1, 250)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('adt', 'test', 3, 'MSH', 'processed')`); err != nil {
		t.Fatal(err)
	}

	cli := func(args ...string) (int, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run(append(args, "--database-url", db.URL), &out, &errb)
		return code, out.String() + errb.String()
	}

	code, out := cli("maintenance", "run", "retention", "--config", file, "--wait", "2m")
	if code != 0 {
		t.Fatalf("maintenance run retention: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "retention: ok") || !strings.Contains(out, "bodies_nulled=250") {
		t.Fatalf("maintenance run output does not report the outcome and count:\n%s", out)
	}
	if got := fixtures.Count(t, db.Pool, "SELECT count(*) FROM mefor_message WHERE raw IS NULL AND body_purged_at IS NOT NULL"); got != 250 {
		t.Fatalf("%d bodies purged, want 250", got)
	}

	code, out = cli("maintenance", "list", "--config", file, "--json")
	if code != 0 {
		t.Fatalf("maintenance list: exit %d\n%s", code, out)
	}
	var list []ops.MaintenanceJob
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("maintenance list --json: %v\n%s", err, out)
	}
	if len(list) != 3 || list[0].Name != "reclaim" || list[1].Name != "retention" || list[2].Name != "audit-anchor" {
		t.Fatalf("jobs listed: %s", out)
	}
	r := list[1]
	if r.Schedule != "0 3 * * *" || r.LastRun == nil || r.LastRun.Outcome != "ok" || r.LastRun.NodeID != "node-1" ||
		r.LastRun.Detail["bodies_nulled"] != float64(250) || r.NextRun == nil || r.NextRun.UTC().Hour() != 3 {
		t.Fatalf("retention listed as %+v", r)
	}

	code, out = cli("maintenance", "list", "--config", file)
	if code != 0 || !strings.Contains(out, "retention") || !strings.Contains(out, "bodies_nulled=250") {
		t.Fatalf("maintenance list table: exit %d\n%s", code, out)
	}

	code, out = cli("status")
	// Seconds old: today's message, not one of the purged 40-day-old ones.
	if code != 0 || !regexp.MustCompile(`oldest retained body: \d+s old`).MatchString(out) {
		t.Fatalf("status does not show the oldest retained body (today's message): exit %d\n%s", code, out)
	}

	code, out = cli("maintenance", "run", "vacuum", "--config", file)
	if code == 0 || !strings.Contains(out, `unknown maintenance job "vacuum"`) || !strings.Contains(out, "reclaim, retention") {
		t.Fatalf("unknown job: exit %d\n%s", code, out)
	}
}
