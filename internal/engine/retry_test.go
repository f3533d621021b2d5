package engine_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Failed deliveries: a lane's head that fails (AE, AR, a refused
// connection, no ACK in time) blocks its lane and is retried under its
// destination's policy until it is delivered or dead-lettered; then the
// lane moves on.

// attemptRecord is one delivery attempt as the message timeline shows it.
type attemptRecord struct {
	outcome string // mefor_response.outcome
	at      time.Time
}

// attemptsOf returns a message's delivery attempts, oldest first.
func attemptsOf(t *testing.T, db *testcontainers.DB, controlID string) []attemptRecord {
	t.Helper()
	return queryRows(t, db, func(row pgx.CollectableRow) (attemptRecord, error) {
		var a attemptRecord
		err := row.Scan(&a.outcome, &a.at)
		return a, err
	}, `
		SELECT r.outcome, r.received_at FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
		WHERE m.control_id = $1 ORDER BY r.attempt`, controlID)
}

// failedDetails returns the details of a message's failed events, oldest first.
func failedDetails(t *testing.T, db *testcontainers.DB, controlID string) []string {
	t.Helper()
	return queryStrings(t, db, `
		SELECT e.detail FROM mefor_event e JOIN mefor_message m ON m.id = e.message_id
		WHERE m.control_id = $1 AND e.event = 'failed' ORDER BY e.id`, controlID)
}

// A head the partner answers AE blocks its fifo lane: it is retried with
// growing backoff, each attempt recorded, and nothing behind it is delivered
// before it is.
func TestHeadOfLineBlockingOnAE(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	const failures = 4
	_, p, listen := startDownstream(t, db, failFirst("H000", failures, hl7.AckError), nil,
		"retry: {backoff: 250ms, multiplier: 3, max_backoff: 1500ms}")

	ids := []string{"H000", "H001", "H002"}
	for _, a := range send(t, listen, adt(ids[0], "P1"), adt(ids[1], "P2"), adt(ids[2], "P3")) {
		if a.Code != hl7.AckAccept {
			t.Fatalf("intake answered %s", a.Code)
		}
	}
	fixtures.Eventually(t, 30*time.Second, "all delivered", func() bool { return len(p.acceptedIDs()) == len(ids) })

	want := []string{"H000", "H000", "H000", "H000", "H000", "H001", "H002"}
	if got := p.receivedIDs(); !slices.Equal(got, want) {
		t.Fatalf("partner received %v, want %v: nothing may pass the failing head", got, want)
	}
	if got := p.acceptedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want %v", got, ids)
	}
	fixtures.Eventually(t, 10*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })

	status, attempts, lastErr := outboundRow(t, db, "H000")
	if status != "done" || attempts != failures+1 || lastErr != "" {
		t.Fatalf("head row: status %s, attempts %d, last_error %q; want done, %d, none", status, attempts, lastErr, failures+1)
	}
	details := failedDetails(t, db, "H000")
	if len(details) != failures {
		t.Fatalf("head has %d failed events, want %d: %q", len(details), failures, details)
	}
	for i, d := range details {
		if prefix := fmt.Sprintf("attempt %d: AE: ", i+1); !strings.HasPrefix(d, prefix) {
			t.Fatalf("failed event %d is %q, want it to start %q", i, d, prefix)
		}
	}
	recs := attemptsOf(t, db, "H000")
	outcomes := make([]string, len(recs))
	for i, r := range recs {
		outcomes[i] = r.outcome
	}
	if want := []string{"AE", "AE", "AE", "AE", "delivered"}; !slices.Equal(outcomes, want) {
		t.Fatalf("attempt outcomes %v, want %v", outcomes, want)
	}
	// Waits between attempts follow the policy: never shorter than the
	// configured backoff (250ms, 750ms, 1.5s, capped 1.5s), and growing.
	// Only lower bounds and a ratio: a busy machine may add delay, never
	// take it away.
	backoffs := []time.Duration{250 * time.Millisecond, 750 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond}
	var gaps []time.Duration
	for i := 1; i < len(recs); i++ {
		gap := recs[i].at.Sub(recs[i-1].at)
		gaps = append(gaps, gap)
		if gap < backoffs[i-1]-10*time.Millisecond {
			t.Fatalf("attempt %d came %s after attempt %d; backoff is %s", i+1, gap, i, backoffs[i-1])
		}
	}
	if gaps[2] < 2*gaps[0] {
		t.Fatalf("waits between attempts %v do not grow", gaps)
	}
	for _, id := range ids[1:] {
		if _, attempts, _ := outboundRow(t, db, id); attempts != 1 {
			t.Fatalf("%s took %d attempts, want 1", id, attempts)
		}
	}
}

// While the partner refuses connections the head is retried, recorded as
// refused, and the message behind it is not even attempted; when the partner
// comes up both are delivered in order.
func TestHeadOfLineBlockingWhilePartnerDown(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	down := downAddr(t)
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, mllpDest("downstream", down, "connect_timeout: 1s", "retry: {backoff: 100ms, multiplier: 1.5, max_backoff: 400ms}"))
	cluster.StartNode(t, db, cfg, nil)
	send(t, listen, adt("D000", "P1"), adt("D001", "P2"))

	fixtures.Eventually(t, 20*time.Second, "head retried", func() bool {
		_, attempts, _, err := tryOutboundRow(db, "D000")
		return err == nil && attempts >= 3
	})
	fixtures.Eventually(t, 10*time.Second, "second message queued for delivery", func() bool {
		_, _, _, err := tryOutboundRow(db, "D001")
		return err == nil
	})
	_, _, lastErr := outboundRow(t, db, "D000")
	if !strings.HasPrefix(lastErr, "refused: ") {
		t.Fatalf("head last_error %q, want it to start \"refused: \"", lastErr)
	}
	if status, attempts, _ := outboundRow(t, db, "D001"); status != "pending" || attempts != 0 {
		t.Fatalf("message behind the head: status %s, attempts %d; want pending, never attempted", status, attempts)
	}

	p := newPartner(t, down, nil)
	fixtures.Eventually(t, 20*time.Second, "both delivered", func() bool { return len(p.acceptedIDs()) == 2 })
	if got := p.receivedIDs(); !slices.Equal(got, []string{"D000", "D001"}) {
		t.Fatalf("partner received %v, want [D000 D001]", got)
	}
	for _, d := range failedDetails(t, db, "D000") {
		if !strings.Contains(d, ": refused: ") {
			t.Fatalf("failed event %q is not a refused connection", d)
		}
	}
}

// A partner that does not answer in ack_timeout counts as a failed attempt
// recorded as timeout; the head is sent again and the lane waits behind it.
func TestHeadOfLineBlockingOnAckTimeout(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", failFirst("T000", 1, hang))
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, mllpDest("downstream", p.addr, "ack_timeout: 500ms", "retry: {backoff: 100ms}"))
	cluster.StartNode(t, db, cfg, nil)
	send(t, listen, adt("T000", "P1"), adt("T001", "P2"))

	fixtures.Eventually(t, 20*time.Second, "both delivered", func() bool { return len(p.acceptedIDs()) == 2 })
	if got := p.receivedIDs(); !slices.Equal(got, []string{"T000", "T000", "T001"}) {
		t.Fatalf("partner received %v, want [T000 T000 T001]", got)
	}
	details := failedDetails(t, db, "T000")
	if len(details) != 1 || !strings.HasPrefix(details[0], "attempt 1: timeout: ") {
		t.Fatalf("failed events %q, want one \"attempt 1: timeout: ...\"", details)
	}
	fixtures.Eventually(t, 10*time.Second, "both processed", func() bool { return countStatus(t, db, "processed") == 2 })
}

// Past max_attempts the head is dead-lettered with the reason, its message
// ends in error, and the lane moves on to the next message.
func TestMaxAttemptsDeadLettersHeadAndLaneMovesOn(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, p, listen := startDownstream(t, db, failFirst("X000", 0, hl7.AckError), nil, "retry: {max_attempts: 3, backoff: 100ms, multiplier: 1}")
	send(t, listen, adt("X000", "P1"), adt("X001", "P2"), adt("X002", "P3"))

	fixtures.Eventually(t, 20*time.Second, "the rest delivered", func() bool { return len(p.acceptedIDs()) == 2 })
	if got := p.receivedIDs(); !slices.Equal(got, []string{"X000", "X000", "X000", "X001", "X002"}) {
		t.Fatalf("partner received %v, want X000 three times, then X001, X002", got)
	}
	fixtures.Eventually(t, 10*time.Second, "final statuses", func() bool {
		return messageStatus(t, db, "X000") == "error" && countStatus(t, db, "processed") == 2
	})
	status, attempts, lastErr := outboundRow(t, db, "X000")
	if status != "dead" || attempts != 3 || !strings.HasPrefix(lastErr, "AE: ") {
		t.Fatalf("head row: status %s, attempts %d, last_error %q; want dead after 3 AE attempts", status, attempts, lastErr)
	}
	dead := queryStrings(t, db, `
		SELECT e.detail FROM mefor_event e JOIN mefor_message m ON m.id = e.message_id
		WHERE m.control_id = 'X000' AND e.event = 'dead'`)
	if len(dead) != 1 || dead[0] != "gave up after 3 attempts" {
		t.Fatalf("dead events %q", dead)
	}
}

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
