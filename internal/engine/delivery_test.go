package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A message sent to a channel is acknowledged AA with its control id, reaches
// both destinations, in order, once, and ends processed.
func TestEndToEndMLLPToMLLPAndFile(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dir := t.TempDir()
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s"}
  archive:
    type: file
    file: {directory: "%s", filename: "{{.ControlID}}.hl7"}
`, p.addr, dir))
	cluster.StartNode(t, db, cfg, nil)

	ids := controlIDs("C%03d", 20)
	acks := send(t, listen, adts(ids, patientEach)...)
	for i, a := range acks {
		if a.Code != hl7.AckAccept || a.ControlID != ids[i] {
			t.Fatalf("ack %d = %s for %q, want AA for %q", i, a.Code, a.ControlID, ids[i])
		}
	}

	fixtures.Eventually(t, 30*time.Second, "all messages delivered", func() bool { return len(p.acceptedIDs()) >= len(ids) })
	if got := p.acceptedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner received %v, want %v (in order, once)", got, ids)
	}
	fixtures.Eventually(t, 10*time.Second, "all messages processed", func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM mefor_message WHERE status = 'processed'").Scan(&n)
		return n == len(ids)
	})
	for _, id := range ids {
		body, err := os.ReadFile(filepath.Join(dir, id+".hl7"))
		if err != nil {
			t.Fatalf("archive file for %s: %v", id, err)
		}
		if _, err := hl7.Parse(body); err != nil {
			t.Fatalf("archive file for %s is not HL7: %v", id, err)
		}
	}
}
