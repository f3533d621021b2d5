package engine_test

import (
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A partner's AR says it will never accept the message. By default
// (on_reject: dead-letter) the row is dead-lettered at the first AR, with
// the partner's reply kept, and the lane moves on at once instead of
// retrying forever behind it. on_reject: retry keeps retrying it under the
// retry policy, the head blocking its lane as any failure does.
func TestPartnerRejectPolicy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, policy string
		retried      bool
	}{
		{"default dead-letters", "", false},
		{"retry", "on_reject: retry", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			const rejects = 3
			_, p, listen := startDownstream(t, db, failFirst("AR000", rejects, hl7.AckReject), nil,
				"retry: {backoff: 100ms, max_backoff: 100ms}", tc.policy)
			send(t, listen, adt("AR000", "P1"), adt("AR001", "P2"))
			// Recorded, not only sent: a delivery's record may follow its
			// send by the destination's record window.
			fixtures.Eventually(t, 30*time.Second, "AR001 delivered", func() bool {
				status, _, _, err := tryOutboundRow(db, "AR001")
				return slices.Contains(ours(p.acceptedIDs(), "AR0"), "AR001") && err == nil && status == "done"
			})

			status, attempts, lastErr := outboundRow(t, db, "AR000")
			if !tc.retried {
				if got := ours(p.receivedIDs(), "AR0"); !slices.Equal(got, []string{"AR000", "AR001"}) {
					t.Fatalf("partner received %v, want AR000 once, then AR001", got)
				}
				if status != "dead" || attempts != 1 {
					t.Fatalf("rejected row: status %s after %d attempts (%s); want dead after 1", status, attempts, lastErr)
				}
				if n := queryInt(t, db, `SELECT count(*) FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
					WHERE m.control_id = 'AR000' AND r.ack_code = 'AR' AND r.body IS NOT NULL`); n != 1 {
					t.Fatalf("rejected row keeps %d AR replies, want 1", n)
				}
				fixtures.Eventually(t, 10*time.Second, "AR000 in error", func() bool { return messageStatus(t, db, "AR000") == "error" })
				return
			}
			want := []string{"AR000", "AR000", "AR000", "AR000", "AR001"}
			if got := ours(p.receivedIDs(), "AR0"); !slices.Equal(got, want) {
				t.Fatalf("partner received %v, want %v: the rejected head retried, blocking its lane", got, want)
			}
			if status != "done" || attempts != rejects+1 {
				t.Fatalf("retried row: status %s after %d attempts; want done after %d", status, attempts, rejects+1)
			}
		})
	}
}
