package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// fileDirs are a file channel's directories in a test.
type fileDirs struct{ in, done, errs string }

func newFileDirs(t *testing.T) fileDirs {
	root := t.TempDir()
	d := fileDirs{in: filepath.Join(root, "in"), done: filepath.Join(root, "in", "done"), errs: filepath.Join(root, "error")}
	if err := os.MkdirAll(d.in, 0o750); err != nil {
		t.Fatal(err)
	}
	return d
}

// fileConfig is a config whose channel lab takes *.hl7 files from dirs.in
// and delivers them to an MLLP partner at addr. moveTo overrides dirs.done.
func fileConfig(t *testing.T, dirs fileDirs, moveTo, addr string) *config.Config {
	t.Helper()
	if moveTo == "" {
		moveTo = dirs.done
	}
	y := fmt.Sprintf(`
cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  lab:
    inbound:
      file: {directory: %q, pattern: "*.hl7", poll: 50ms, settle: 300ms, move_to: %q, error_dir: %q}
    routes: [{destinations: [lis]}]
destinations:
  lis:
    type: mllp
    mllp: {address: %q}
`, dirs.in, moveTo, dirs.errs, addr)
	cfg, err := config.Parse("test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatalf("test config: %v\n%s", err, y)
	}
	return cfg
}

// oru is a small lab result with the given control id.
func oru(controlID string) string {
	return "MSH|^~\\&|LAB|HOSP|MEFOR|MEFOR|20240102081500||ORU^R01|" + controlID + "|P|2.5.1\r" +
		"PID|1||4711^^^HOSP^MR||DOE^JANE\r" +
		"OBX|1|NM|GLU^Glucose||5.5|mmol/L\r"
}

// dropFile writes a file into dir the way a careful sender does (a hidden
// temp name, then a rename), with its modification time set to mtime.
func dropFile(t *testing.T, dir, name, content string, mtime time.Time) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".part")
	if err := os.WriteFile(tmp, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// storedControlIDs lists the control ids of the channel's messages, in id
// order.
func storedControlIDs(t *testing.T, db *testcontainers.DB, channel string) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT coalesce(control_id, '') FROM mefor_message WHERE channel = $1 ORDER BY id`, channel)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Several messages per file, with any line ending, and a batch envelope:
// every message stored once and delivered in file order, files oldest first;
// messages show the file they came from.
func TestFileIntakeStoresFilesWholeInOrder(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dirs := newFileDirs(t)
	old := time.Now().Add(-time.Minute)
	// Dropped before the node starts: taken oldest first, whatever their
	// names say.
	dropFile(t, dirs.in, "1-batch.hl7", strings.ReplaceAll("FHS|^~\\&|LAB\rBHS|^~\\&|LAB\r"+oru("B1")+oru("B2")+"BTS|2\rFTS|1\r", "\r", "\r\n"), old.Add(time.Second))
	dropFile(t, dirs.in, "2-lf.hl7", strings.ReplaceAll(oru("C1")+oru("C2")+oru("C3"), "\r", "\n"), old.Add(2*time.Second))
	dropFile(t, dirs.in, "3-wire.hl7", oru("A1")+oru("A2"), old)
	dropFile(t, dirs.in, "notes.txt", "not for this channel", old) // pattern *.hl7
	n := cluster.StartNode(t, db, fileConfig(t, dirs, "", p.addr), nil)

	want := []string{"A1", "A2", "B1", "B2", "C1", "C2", "C3"}
	fixtures.Eventually(t, 20*time.Second, "every message delivered", func() bool { return len(p.acceptedIDs()) >= len(want) })
	if got := p.acceptedIDs(); !slices.Equal(got, want) {
		t.Fatalf("partner got %v, want %v (file order, oldest file first)", got, want)
	}
	if got := storedControlIDs(t, db, "lab"); !slices.Equal(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	for _, name := range []string{"1-batch.hl7", "2-lf.hl7", "3-wire.hl7"} {
		fixtures.Eventually(t, 5*time.Second, name+" moved to move_to", func() bool {
			return exists(filepath.Join(dirs.done, name)) && !exists(filepath.Join(dirs.in, name))
		})
	}
	if !exists(filepath.Join(dirs.in, "notes.txt")) {
		t.Fatal("a file the pattern does not match was taken")
	}
	if got := n.PolledChannels(); !slices.Equal(got, []string{"lab"}) {
		t.Fatalf("polled channels %v", got)
	}

	// messages show: source file, the file's name and place, same statuses
	// and events as MLLP intake.
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT id FROM mefor_message WHERE control_id = 'B2'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 10*time.Second, "B2 processed", func() bool {
		v, err := ops.ShowMessage(context.Background(), db.Pool, nil, id, false)
		return err == nil && v.Message.Status == "processed"
	})
	v, err := ops.ShowMessage(context.Background(), db.Pool, nil, id, false)
	if err != nil {
		t.Fatal(err)
	}
	f := v.Origin.File
	if v.Message.Source != "file" || f == nil || f.Name != "1-batch.hl7" || f.Index != 2 || f.Messages != 2 || f.Node != t.Name() {
		t.Fatalf("source %q, file %+v", v.Message.Source, f)
	}
	var events []string
	for _, e := range v.Events {
		events = append(events, e.Event)
	}
	if !slices.Equal(events, []string{"received", "routed", "transformed", "delivered"}) {
		t.Fatalf("events %v", events)
	}
}

// A file still being written is left alone until it has settled, then
// taken whole: its messages are stored once, all together.
func TestFileIntakeLeavesHalfWrittenFile(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dirs := newFileDirs(t)
	cluster.StartNode(t, db, fileConfig(t, dirs, "", p.addr), nil)

	path := filepath.Join(dirs.in, "growing.hl7")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const parts = 15
	var want []string
	for i := range parts {
		id := fmt.Sprintf("G%02d", i)
		want = append(want, id)
		if _, err := f.WriteString(oru(id)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(80 * time.Millisecond) // shorter than settle (300ms), longer than poll (50ms)
		if got := storedControlIDs(t, db, "lab"); len(got) > 0 {
			t.Fatalf("stored %v while the file was still being written", got)
		}
	}
	f.Close()
	fixtures.Eventually(t, 20*time.Second, "the file's messages delivered", func() bool { return len(p.acceptedIDs()) >= parts })
	if got := storedControlIDs(t, db, "lab"); !slices.Equal(got, want) {
		t.Fatalf("stored %v, want %v once each", got, want)
	}
	if got := p.acceptedIDs(); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// A file that is not HL7, or not wholly (a batch cut short), goes to
// error_dir with a note saying why; nothing of it is stored, and the files
// around it are taken as usual.
func TestFileIntakeMovesUnparseableToErrorDir(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dirs := newFileDirs(t)
	old := time.Now().Add(-time.Minute)
	dropFile(t, dirs.in, "1-good.hl7", oru("OK1"), old)
	dropFile(t, dirs.in, "2-junk.hl7", "Dear lab,\nplease find the results attached.\n", old.Add(time.Second))
	dropFile(t, dirs.in, "3-cut.hl7", "BHS|^~\\&|LAB\r"+oru("CUT1")+oru("CUT2")+"BTS|3\r", old.Add(2*time.Second))
	dropFile(t, dirs.in, "4-bad-msh.hl7", oru("BAD1")+"MSH|^\r", old.Add(3*time.Second))
	dropFile(t, dirs.in, "5-good.hl7", oru("OK2"), old.Add(4*time.Second))
	cluster.StartNode(t, db, fileConfig(t, dirs, "", p.addr), nil)

	fixtures.Eventually(t, 20*time.Second, "the good files delivered", func() bool { return len(p.acceptedIDs()) >= 2 })
	for name, why := range map[string]string{
		"2-junk.hl7":    "segment outside any message",
		"3-cut.hl7":     "batch trailer (BTS) counts 3 messages, the batch holds 2",
		"4-bad-msh.hl7": "message 2 of 2 is not a valid HL7 v2 message",
	} {
		fixtures.Eventually(t, 5*time.Second, name+" in error_dir", func() bool { return exists(filepath.Join(dirs.errs, name+".error.txt")) })
		note, err := os.ReadFile(filepath.Join(dirs.errs, name+".error.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(note), why) || strings.Contains(string(note), "PID") || strings.Contains(string(note), "Dear lab") {
			t.Errorf("note for %s:\n%s\nwant the reason %q and no content", name, note, why)
		}
		if !exists(filepath.Join(dirs.errs, name)) || exists(filepath.Join(dirs.in, name)) {
			t.Errorf("%s not moved to error_dir", name)
		}
	}
	if got := storedControlIDs(t, db, "lab"); !slices.Equal(got, []string{"OK1", "OK2"}) {
		t.Fatalf("stored %v, want only the good files' messages", got)
	}
}

// A node that stored a file but could not move it (as if it died between
// the commit and the move) never stores it again: not at its own next
// polls, not after a restart.
func TestFileStoredButNotMovedIsNotStoredAgain(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dirs := newFileDirs(t)
	blocked := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(blocked, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	dropFile(t, dirs.in, "results.hl7", oru("R1")+oru("R2")+oru("R3"), time.Now().Add(-time.Minute))

	// move_to under a regular file: the move fails after every commit.
	cfg := fileConfig(t, dirs, filepath.Join(blocked, "done"), p.addr)
	opts := func(o *engine.Options) { o.NodeID = "first" }
	a := cluster.Start(t, cluster.NodeOptions(t, db, cfg, opts))
	fixtures.Eventually(t, 20*time.Second, "the file's messages delivered", func() bool { return len(p.acceptedIDs()) >= 3 })
	time.Sleep(500 * time.Millisecond) // ten more polls, each finding the file still there
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(dirs.in, "results.hl7")) {
		t.Fatal("the file was moved although move_to cannot be written")
	}

	cluster.StartNode(t, db, fileConfig(t, dirs, "", p.addr), func(o *engine.Options) { o.NodeID = "second" })
	fixtures.Eventually(t, 10*time.Second, "the file moved by the restarted node", func() bool { return exists(filepath.Join(dirs.done, "results.hl7")) })
	time.Sleep(300 * time.Millisecond)
	if got := storedControlIDs(t, db, "lab"); !slices.Equal(got, []string{"R1", "R2", "R3"}) {
		t.Fatalf("stored %v, want each message once", got)
	}
	if got := p.acceptedIDs(); !slices.Equal(got, []string{"R1", "R2", "R3"}) {
		t.Fatalf("delivered %v, want each message once", got)
	}
}

// Two nodes share the directory: only the lease holder polls it, and after
// a stepdown the other node does.
func TestOnlyLeaseHolderPollsAndStepdownMovesPolling(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dirs := newFileDirs(t)
	cfg := fileConfig(t, dirs, "", p.addr)
	a := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "node-a" })
	b := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "node-b" })
	if !a.Lease().Serving() || b.Lease().Serving() {
		t.Fatal("node-a should hold the lease, node-b stand by")
	}
	if ga, gb := a.PolledChannels(), b.PolledChannels(); len(ga) != 1 || len(gb) != 0 {
		t.Fatalf("polling: node-a %v, node-b %v; want only the holder", ga, gb)
	}
	dropFile(t, dirs.in, "first.hl7", oru("F1"), time.Now().Add(-time.Minute))
	fixtures.Eventually(t, 10*time.Second, "first.hl7 moved", func() bool { return exists(filepath.Join(dirs.done, "first.hl7")) })

	res := a.Lease().StepDown(context.Background())
	if res.Outcome != "released" {
		t.Fatalf("stepdown: %+v", res)
	}
	if got := a.PolledChannels(); len(got) != 0 {
		t.Fatalf("node-a still polls %v after stepping down", got)
	}
	fixtures.Eventually(t, 10*time.Second, "node-b polling", func() bool { return len(b.PolledChannels()) == 1 })
	dropFile(t, dirs.in, "second.hl7", oru("S1"), time.Now().Add(-time.Minute))
	fixtures.Eventually(t, 10*time.Second, "second.hl7 moved", func() bool { return exists(filepath.Join(dirs.done, "second.hl7")) })

	taken := queryStrings(t, db, `SELECT name || ' ' || node_id FROM mefor_intake_file ORDER BY id`)
	if want := []string{"first.hl7 node-a", "second.hl7 node-b"}; !slices.Equal(taken, want) {
		t.Fatalf("files taken %v, want %v", taken, want)
	}
	fixtures.Eventually(t, 10*time.Second, "both delivered", func() bool { return len(p.acceptedIDs()) >= 2 })
	if got := storedControlIDs(t, db, "lab"); !slices.Equal(got, []string{"F1", "S1"}) {
		t.Fatalf("stored %v", got)
	}
}
