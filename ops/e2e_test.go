package ops_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// startNode runs a real node (River workers, drainers) on the env's database
// with one channel "adt" delivering to a file destination "archive" writing
// into dir, with the given retry block.
func (e *env) startNode(dir, retry string) {
	e.t.Helper()
	listen := fixtures.FreeAddr(e.t)
	y := fixtures.ADTChannel(listen) + fmt.Sprintf(`
      - name: out
        destinations: [archive]
destinations:
  archive:
    type: file
    file: {directory: "%s"}
    retry: %s
`, dir, retry)
	cfg, err := config.Parse("test.yaml", []byte(y), nil)
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, y)
	}
	cluster.Start(e.t, engine.Options{Config: cfg, Pool: e.db.Pool, NodeID: e.t.Name(), ReclaimInterval: time.Hour})
}

func (e *env) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	fixtures.Poll(e.t, timeout, 50*time.Millisecond, what, cond)
}

func (e *env) workStatus(msg int64, stage string) string {
	e.t.Helper()
	return e.queryStr("SELECT coalesce(max(status), '') FROM mefor_work WHERE message_id = $1 AND stage = $2", msg, stage)
}

// With real drainers: deliveries dead-lettered while the destination was
// broken are delivered after replay-dead once it works again. The reclaim
// sweep is effectively off (hourly), so only the replay's own lane
// activation can get them drained.
func TestReplayDeadIsDrainedByRunningNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	base := t.TempDir()
	out := filepath.Join(base, "out")
	if err := os.WriteFile(out, nil, 0o600); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	e.startNode(out, "{max_attempts: 1, backoff: 100ms}")

	var ids []int64
	for range 3 {
		ids = append(ids, e.receive("adt"))
	}
	for _, id := range ids {
		e.waitFor(fmt.Sprintf("message %d dead-lettered", id), 30*time.Second, func() bool { return e.status(id) == pipeline.StatusError })
	}
	// Its drainer gone, the lane has nobody to drain it but the drainer
	// the replay inserts.
	e.waitFor("the lane's drainer to finish", 30*time.Second, func() bool {
		_, state := e.drainerState("outbound:archive")
		return state == "completed"
	})
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}

	res, err := ops.ReplayDead(e.ctx, e.db.Pool, pipeline.DeadFilter{Destination: "archive"}, ops.BulkOptions{})
	if err != nil || res.Rows != 3 {
		t.Fatalf("replay-dead = %+v, %v; want 3 rows", res, err)
	}
	for _, id := range ids {
		e.waitFor(fmt.Sprintf("message %d processed", id), 30*time.Second, func() bool { return e.status(id) == pipeline.StatusProcessed })
	}
	files, _ := os.ReadDir(out)
	if len(files) != 3 {
		t.Fatalf("%d files delivered, want 3", len(files))
	}
}

// With real drainers: a delivery waiting out a long backoff is retried at
// once when replayed (its snoozed drainer is woken), not an hour later.
func TestReplayWakesSnoozedDrainer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	base := t.TempDir()
	out := filepath.Join(base, "out")
	if err := os.WriteFile(out, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.startNode(out, "{max_attempts: 0, backoff: 1h, max_backoff: 1h}")

	id := e.receive("adt")
	e.waitFor("a failed attempt", 30*time.Second, func() bool {
		return e.queryInt("SELECT coalesce(max(attempts), 0) FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'", id) >= 1
	})
	e.waitFor("the drainer to snooze", 30*time.Second, func() bool {
		_, state := e.drainerState("outbound:archive")
		return state == "scheduled"
	})
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}

	res, err := ops.Replay(e.ctx, e.db.Pool, id)
	if err != nil || res.Rows != 1 {
		t.Fatalf("replay = %+v, %v", res, err)
	}
	e.waitFor("delivery after replay", 30*time.Second, func() bool { return e.workStatus(id, "outbound") == pipeline.WorkDone })
	if got := e.status(id); got != pipeline.StatusProcessed {
		t.Fatalf("message is %s, want processed", got)
	}
}

// With real drainers and an operator login: a dead-lettered delivery whose
// lane's drainer has finished (nothing else would drain it: reclaim is
// hourly) is delivered after the operator's replay, through the drainer
// job the replay function inserted in SQL and River's node ran.
func TestOperatorReplayIntoAnIdleLaneIsDrainedByRunningNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := migrations.ApplyRoles(e.ctx, e.db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	_, operator := fixtures.LoginPool(t, e.db, migrations.RoleOperator)
	base := t.TempDir()
	out := filepath.Join(base, "out")
	if err := os.WriteFile(out, nil, 0o600); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	e.startNode(out, "{max_attempts: 1, backoff: 100ms}")

	id := e.receive("adt")
	e.waitFor("the message dead-lettered", 30*time.Second, func() bool { return e.status(id) == pipeline.StatusError })
	const lane = "outbound:archive"
	before, _ := e.drainerState(lane)
	e.waitFor("the lane's drainer to finish", 30*time.Second, func() bool {
		_, state := e.drainerState(lane)
		return state == "completed"
	})
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}

	res, err := ops.Replay(e.ctx, operator, id)
	if err != nil || res.Rows != 1 {
		t.Fatalf("operator's replay = %+v, %v; want 1 row", res, err)
	}
	after, _ := e.drainerState(lane)
	if after == before {
		t.Fatalf("the replay left the lane with its finished drainer %d", before)
	}
	e.waitFor("delivery after the operator's replay", 30*time.Second, func() bool {
		return e.status(id) == pipeline.StatusProcessed
	})
	if files, _ := os.ReadDir(out); len(files) != 1 {
		t.Fatalf("%d files delivered, want 1", len(files))
	}
}
