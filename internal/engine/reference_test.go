package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// refConfig is a channel whose handler translates PID-8 (sex) through the
// reference set "sex-codes", read from a CSV file, and files the result. It
// returns the config, the CSV file's path (no file is there yet) and the
// directory the results are filed in.
func refConfig(t *testing.T, listen, onMiss string) (*config.Config, string, string) {
	t.Helper()
	csvPath, outDir := filepath.Join(t.TempDir(), "sex.csv"), t.TempDir()
	y := fixtures.ADTChannel(listen) + fmt.Sprintf(`
      - name: out
        handler: translate
        destinations: [archive]
handlers:
  translate:
    type: map
    map:
      - lookup: {from: PID-8, set: sex-codes, %s}
destinations:
  archive:
    type: file
    file: {directory: "%s", filename: "{{.ControlID}}.hl7"}
reference_sets:
  sex-codes:
    refresh: 1h
    source:
      csv: {path: "%s"}
`, onMiss, outDir, csvPath)
	return parseConfig(t, y), csvPath, outDir
}

// filedPID8 is PID-8 of the message filed as id, "" until it is there.
func filedPID8(dir, id string) string {
	raw, err := os.ReadFile(filepath.Join(dir, id+".hl7"))
	if err != nil {
		return ""
	}
	msg, err := hl7.Parse(raw)
	if err != nil {
		return ""
	}
	return msg.Get("PID-8")
}

func lastSyncID(t *testing.T, db *testcontainers.DB) int {
	return queryInt(t, db, `SELECT coalesce(max(id), 0) FROM mefor_maintenance_run WHERE job = 'reference-sync:sex-codes' AND outcome = 'ok'`)
}

// syncs counts the recorded syncs of sex-codes that ended with outcome.
func syncs(t *testing.T, db *testcontainers.DB, outcome string) int {
	return queryInt(t, db, `SELECT count(*) FROM mefor_maintenance_run WHERE job = 'reference-sync:sex-codes' AND outcome = $1`, outcome)
}

// syncUntil asks n to sync sex-codes until done holds. The sync kind is
// unique per set while live, and River marks a job completed a moment
// after its record commits: an insert right after a sync can be skipped as
// a duplicate of it, so one insert is not enough.
func syncUntil(t *testing.T, n *engine.Node, what string, done func() bool) {
	t.Helper()
	fixtures.Eventually(t, 30*time.Second, what, func() bool {
		if done() {
			return true
		}
		if _, err := n.Client().Insert(context.Background(), jobs.ReferenceSyncArgs{Set: "sex-codes"}, nil); err != nil {
			t.Fatal(err)
		}
		return false
	})
}

// A set synced by whichever node works the job is served by every node
// within a heartbeat, from the database: the source is gone by then.
func TestReferenceSetReachesEveryNode(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	cfg, csvPath, out := refConfig(t, listen, "on_miss: keep")
	writeFile(t, csvPath, "code,text\nF,female\nM,male\n")
	a := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "node-a" })
	b := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "node-b" })

	// The set had no snapshot, so starting enqueued its first sync.
	fixtures.Eventually(t, 30*time.Second, "first sync", func() bool { return lastSyncID(t, db) > 0 })
	send(t, listen, adt("R1", "P1"))
	fixtures.Eventually(t, 30*time.Second, "R1 filed translated", func() bool { return filedPID8(out, "R1") == "female" })

	for _, n := range []*engine.Node{a, b} {
		fixtures.Eventually(t, 10*time.Second, "both nodes hold the first snapshot", func() bool {
			v, found, err := n.ReferenceCache().Lookup("sex-codes", "F", "")
			return err == nil && found && v == "female"
		})
	}

	// New content, synced through the job (any node may work it).
	writeFile(t, csvPath, "code,text\nF,FEMALE\nM,MALE\n")
	before := lastSyncID(t, db)
	syncUntil(t, b, "second sync", func() bool { return lastSyncID(t, db) > before })
	if err := os.Remove(csvPath); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]*engine.Node{"a": a, "b": b} {
		fixtures.Eventually(t, 10*time.Second, "node "+name+" serves the new snapshot", func() bool {
			v, _, err := n.ReferenceCache().Lookup("sex-codes", "F", "")
			return err == nil && v == "FEMALE"
		})
	}
	send(t, listen, adt("R2", "P2"))
	fixtures.Eventually(t, 30*time.Second, "R2 filed with the new translation", func() bool { return filedPID8(out, "R2") == "FEMALE" })

	// A sync from the missing source fails and keeps the snapshot.
	syncUntil(t, a, "failed sync recorded", func() bool { return syncs(t, db, "failed") > 0 })
	send(t, listen, adt("R3", "P3"))
	fixtures.Eventually(t, 30*time.Second, "R3 filed with the kept snapshot", func() bool { return filedPID8(out, "R3") == "FEMALE" })
}

// A message whose lookup has no snapshot to read waits, holding its lane,
// instead of being dead-lettered; the first successful sync releases it.
// A code missing from the set then dead-letters its message with a reason
// naming the set and field, not the code.
func TestLookupWaitsForFirstSnapshot(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	cfg, csvPath, out := refConfig(t, listen, "on_miss: dead-letter") // no CSV yet: the first sync fails
	n := cluster.StartNode(t, db, cfg, nil)

	fixtures.Eventually(t, 30*time.Second, "failed first sync", func() bool {
		return syncs(t, db, "failed") > 0
	})
	send(t, listen, adt("W1", "P1"))
	// Give the routed drainer time to try (several retries of 2s would
	// be needed to notice a dead-letter that is not there, so check the
	// lane holds on the first attempt's outcome instead).
	fixtures.Eventually(t, 30*time.Second, "W1 routed", func() bool { return messageStatus(t, db, "W1") != "received" })
	time.Sleep(time.Second)
	if st := messageStatus(t, db, "W1"); st != "routed" {
		t.Fatalf("W1 is %s while the set has no snapshot, want it waiting (routed)", st)
	}
	if dead := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); dead != 0 {
		t.Fatalf("%d rows dead-lettered while the set has no snapshot", dead)
	}

	writeFile(t, csvPath, "code,text\nF,female\n")
	// The failed sync may not be finalized yet.
	syncUntil(t, n, "a successful sync", func() bool { return syncs(t, db, "ok") > 0 })
	fixtures.Eventually(t, 30*time.Second, "W1 filed translated", func() bool { return filedPID8(out, "W1") == "female" })

	// M is not in the set.
	msg := strings.Replace(string(adt("W2", "P2")), "||19800101|F", "||19800101|M", 1)
	send(t, listen, []byte(msg))
	fixtures.Eventually(t, 30*time.Second, "W2 dead-lettered", func() bool { return messageStatus(t, db, "W2") == "error" })
	reason := queryStrings(t, db, `SELECT coalesce(w.last_error, '') FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE m.control_id = 'W2' AND w.status = 'dead'`)
	if len(reason) != 1 || !strings.Contains(reason[0], `PID(1)-8: the value is not in reference set "sex-codes"`) {
		t.Fatalf("dead reason %q, want one naming the field and the set", reason)
	}
}

// A node serves lookups from the moment Start returns: it loads the
// snapshots before its River client takes any work, so no message is
// transformed against an empty cache.
func TestNodeLoadsSnapshotsBeforeWorking(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	cfg, csvPath, _ := refConfig(t, fixtures.FreeAddr(t), "on_miss: keep")
	writeFile(t, csvPath, "code,text\nF,female\n")
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "earlier"}
	if _, err := syncer.Sync(context.Background(), cfg.ReferenceSet("sex-codes")); err != nil {
		t.Fatal(err)
	}
	n := cluster.StartNode(t, db, cfg, nil)
	v, found, err := n.ReferenceCache().Lookup("sex-codes", "F", "")
	if err != nil || !found || v != "female" {
		t.Fatalf("lookup right after Start: %q, %v, %v; want the stored snapshot", v, found, err)
	}
	// And with a snapshot there, starting enqueues no sync.
	if jobs := queryInt(t, db, `SELECT count(*) FROM river_job WHERE kind = 'mefor_reference_sync'`); jobs != 0 {
		t.Errorf("%d sync jobs enqueued at start though the set had a snapshot", jobs)
	}
}
