package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A superuser who copies another patient's sealed payload onto a queued
// delivery gets nothing sent: the value is bound to its message, so it
// does not open on the other row, which is dead-lettered as tampered; the
// lane moves on and the untouched message is delivered. The same for a
// value written in clear once keys rotate sealed the store.
func TestCiphertextCopiedAcrossRowsIsRefused(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	k1 := newKeySpec(t, "k1")
	kr, err := crypt.Parse(k1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	partnerAddr := unusedAddr(t) // down: the deliveries stay queued
	listen := unusedAddr(t)
	stop, err := startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true})
	if err != nil {
		t.Fatal(err)
	}
	sendMLLP(t, listen, phiMessage("C1", "PA0001", "FIRST^PATIENT"))
	sendMLLP(t, listen, phiMessage("C2", "PB0002", "SECOND^PATIENT"))
	sendMLLP(t, listen, phiMessage("C3", "PC0003", "THIRD^PATIENT"))
	cluster.Poll(t, 30*time.Second, "three queued deliveries", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`).Scan(&n)
		return n == 3
	})
	stop()

	// The superuser's rewrites: C1's sealed payload onto C2's delivery,
	// and C3's as plaintext.
	var w1, w2, w3 int64
	if err := db.Pool.QueryRow(ctx, `
		SELECT (SELECT w.id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id WHERE w.stage = 'outbound' AND m.control_id = 'C1'),
		       (SELECT w.id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id WHERE w.stage = 'outbound' AND m.control_id = 'C2'),
		       (SELECT w.id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id WHERE w.stage = 'outbound' AND m.control_id = 'C3')`).
		Scan(&w1, &w2, &w3); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_work SET payload = (SELECT payload FROM mefor_work WHERE id = $1) WHERE id = $2`, w1, w2); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_work SET payload = convert_to('MSH|^~\&|EVIL|X|||20240101||ADT^A01|C3|P|2.5', 'UTF8') WHERE id = $1`, w3); err != nil {
		t.Fatal(err)
	}
	// keys rotate seals the store: plaintext is refused from now on. (The
	// plaintext written above is then sealed by rotate, so write it again
	// after the rotation, as a superuser would.)
	if code, out, errs := cli(t, db.URL, k1, "keys", "rotate"); code != 0 || !strings.Contains(out, "sealed to its row") {
		t.Fatalf("keys rotate: exit %d\n%s%s", code, out, errs)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_work SET payload = convert_to('MSH|^~\&|EVIL|X|||20240101||ADT^A01|C3|P|2.5', 'UTF8') WHERE id = $1`, w3); err != nil {
		t.Fatal(err)
	}

	partner := newReplyingPartnerAt(t, partnerAddr)
	var logs fixtures.SyncBuffer
	stop, err = startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true, log: &logs})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	defer func() {
		if t.Failed() {
			t.Logf("node log:\n%s", logs.String())
		}
	}()
	for _, w := range []int64{w2, w3} {
		cluster.Poll(t, 30*time.Second, "the rewritten delivery dead-lettered as tampered", func() bool {
			var status, lastErr string
			var msg int64
			_ = db.Pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), message_id FROM mefor_work WHERE id = $1`, w).Scan(&status, &lastErr, &msg)
			return status == "dead" && strings.HasPrefix(pipeline.OpenText(kr, msg, lastErr), "tampered: ")
		})
	}
	cluster.Poll(t, 30*time.Second, "the untouched message delivered", func() bool { return len(partner.received()) == 1 })
	time.Sleep(time.Second)
	got := partner.received()
	if len(got) != 1 || !bytes.Contains(got[0], []byte("FIRST^PATIENT")) {
		t.Fatalf("the partner received %d messages, want only C1's: %q", len(got), got)
	}
	for _, bad := range []string{"FIRST", "SECOND", "THIRD", "EVIL"} {
		if strings.Contains(logs.String(), bad) {
			t.Fatalf("the node logged message content (%s)", bad)
		}
	}
	if !strings.Contains(logs.String(), "tampered") {
		t.Fatal("the node did not log the tampered rows")
	}
}
