package engine_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// File names built from MSH-10 stay in the destination's directory, never
// replace another message's file or follow a planted symlink, and a name
// that cannot be written dead-letters at once with its reason, though
// retries are unlimited, so the lane moves on.
func TestFileNamesFromControlIDs(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	archive, nested, outside := t.TempDir(), t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(archive, "PLANT.hl7")); err != nil {
		t.Fatal(err)
	}
	// nested puts each file under the channel's directory, which is a
	// symlink out of it: no name there can be written.
	if err := os.Symlink(outside, filepath.Join(nested, "adt")); err != nil {
		t.Fatal(err)
	}
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  archive:
    type: file
    file: {directory: "%s", filename: "{{.ControlID}}.hl7"}
  nested:
    type: file
    file: {directory: "%s", filename: "{{.Channel}}/{{.ControlID}}.hl7"}
`, archive, nested))
	cluster.StartNode(t, db, cfg, nil)

	long := strings.Repeat("L", 300)
	ids := []string{"A/B", "..", long, "DUP", "DUP", "PLANT", "LAST", "N\x00UL"}
	for i, a := range send(t, listen, adts(ids, patientEach)...) {
		if a.Code != hl7.AckAccept {
			t.Fatalf("ack %d = %s", i, a.Code)
		}
	}

	fixtures.Eventually(t, 30*time.Second, "every message ended", func() bool {
		return countStatus(t, db, "error") == len(ids)
	})
	want := map[string]string{
		"A_B.hl7": "P0", "__.hl7": "P1", strings.Repeat("L", 100) + ".hl7": "P2",
		"DUP.hl7": "P3", "DUP.1.hl7": "P4", "PLANT.1.hl7": "P5", "LAST.hl7": "P6", "N_UL.hl7": "P7",
	}
	for name, patient := range want {
		body, err := os.ReadFile(filepath.Join(archive, name))
		if err != nil {
			t.Fatalf("archive file %s: %v", name, err)
		}
		if !strings.Contains(string(body), "PID|1||"+patient+"^") {
			t.Fatalf("archive file %s holds another message than %s's", name, patient)
		}
	}
	if entries, _ := os.ReadDir(archive); len(entries) != len(want)+1 { // the planted symlink
		t.Fatalf("archive holds %d entries, want %d", len(entries), len(want)+1)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("planted symlink followed: victim now %q", b)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Fatalf("written through the symlinked directory: %d entries outside", len(entries))
	}

	// Each nested row died at its first attempt, with the reason, and
	// neither the reason nor last_error holds the control id.
	rows := queryStrings(t, db, `
		SELECT w.status || ' ' || w.attempts || ' ' || coalesce(w.last_error, '') || ' | ' || e.detail
		FROM mefor_work w JOIN mefor_event e ON e.message_id = w.message_id AND e.event = 'dead'
		WHERE w.destination = 'nested' ORDER BY w.message_id`)
	if len(rows) != len(ids) {
		t.Fatalf("%d dead nested rows, want %d: %q", len(rows), len(ids), rows)
	}
	for _, r := range rows {
		if !strings.HasPrefix(r, "dead 1 bad-name: ") || !strings.Contains(r, "| file name cannot be written: bad-name: ") ||
			strings.Contains(r, "DUP") || strings.Contains(r, "LAST") {
			t.Fatalf("nested row %q: want dead after one attempt, the reason given, no control id", r)
		}
	}
}
