package workers_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
)

// The leader anchors the audit log on its own, signed with the audit key:
// rows cut off the end are then caught by audit verify though nobody ran
// `mefor audit anchor`.
func TestLeaderAnchorsTheAuditLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	keys, err := audit.ParseKeys("a1=" + base64.StdEncoding.EncodeToString(raw))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionReplay,
			Target: map[string]any{"message_ids": []int{i}}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := adtToOut(t, `
maintenance:
  audit_anchor: {schedule: 1s}
`, nil)
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.AuditKeys = keys })

	var latest audit.StoredAnchor
	cluster.Poll(t, 60*time.Second, "a signed anchor of row 5", func() bool {
		as, err := audit.AnchorsAfter(ctx, db.Pool, 0, 100)
		if err != nil || len(as) == 0 {
			return false
		}
		latest = as[len(as)-1]
		return latest.Seq == 5 && latest.MAC != "" && latest.KeyID == "a1"
	})
	if v, err := audit.VerifyWith(ctx, db.Pool, audit.VerifyOptions{Keys: keys}); err != nil || !v.OK() || v.AnchorsSigned == 0 {
		t.Fatalf("verify = %+v, %v", v, err)
	}

	if _, err := db.Pool.Exec(ctx, `DELETE FROM mefor_audit WHERE seq >= 4`); err != nil {
		t.Fatal(err)
	}
	v, err := audit.Verify(ctx, db.Pool, nil)
	if err != nil || v.OK() || v.BadSeq != 5 || !strings.Contains(v.Problem, "rows 4 to 5 were deleted") {
		t.Fatalf("verify of the cut log = %+v, %v; want rows 4 to 5 named", v, err)
	}
}
