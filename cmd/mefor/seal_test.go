package main

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
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
	if code, out, errs := cli(t, db.URL, k1, "status"); code != 0 || strings.Contains(out, "plaintext accepted") {
		t.Fatalf("status of a new store whose first node had keys: exit %d\n%s%s", code, out, errs)
	}
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
	stop, err = startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true, log: &logs, alerts: `alerts:
  interval: 1s
  sinks:
    ops: {log: {level: error}}
  rules:
    - {name: lab-tampered, destination: lab, tampered: 2, sinks: [ops]}
`})
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
	if code, out, errs := cli(t, db.URL, k1, "status"); code != 0 || strings.Contains(out, "plaintext accepted") {
		t.Fatalf("status after keys rotate: exit %d\n%s%s", code, out, errs)
	}
	// The alert fires on them.
	cluster.Poll(t, 10*time.Second, "the tampered alert firing", func() bool {
		var state string
		_ = db.Pool.QueryRow(ctx, `SELECT state FROM mefor_alert WHERE rule = 'lab-tampered'`).Scan(&state)
		return state == "firing" && strings.Contains(logs.String(), "2 rows dead-lettered as tampered")
	})
}

// A node whose database is on another host refuses to start without keys,
// before connecting, naming the fix; --allow-plaintext-storage, keys, or a
// database on this machine let it through.
func TestRunRefusesPlaintextStorageOnARemoteDatabase(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	remote, conns := db.RemoteURL(t)
	file, _, _ := archiveConfig(t)
	var out, errb bytes.Buffer
	code := runEnv([]string{"--database-url", remote, "--allow-insecure-database", "run", "--config", file}, &out, &errb, envWith(""))
	if code != 1 {
		t.Fatalf("exit %d, want 1 (refused)\n%s%s", code, out.String(), errb.String())
	}
	if msg := errb.String(); !strings.Contains(msg, "--allow-plaintext-storage") || !strings.Contains(msg, crypt.EnvKeys) {
		t.Errorf("the refusal does not name the fix:\n%s", msg)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections reached the database before the refusal", n)
	}

	for _, c := range []struct {
		url         string
		keys, allow bool
	}{{remote, false, true}, {remote, true, false}, {db.URL, false, false}, {"postgres:///mefor?host=/run/postgresql", false, false}} {
		if err := checkPlaintextStorage(c.url, c.keys, c.allow); err != nil {
			t.Errorf("checkPlaintextStorage(keys %v, allow %v) of %s: %v", c.keys, c.allow, c.url, err)
		}
	}

	// Without keys patients are not indexed, and a search by patient says so.
	if code, out, errs := cli(t, db.URL, "", "messages", "list", "--patient", "P100"); code == 0 || !strings.Contains(errs, "patient search needs encryption keys") {
		t.Fatalf("messages list --patient without keys: exit %d\n%s%s", code, out, errs)
	}
}

// sealV1 seals plain as the release before row binding did (envelope
// mfe1, authenticated with the column only), from the key spec "id=base64".
func sealV1(t *testing.T, spec string, col crypt.Column, plain []byte) []byte {
	t.Helper()
	id, b64, _ := strings.Cut(spec, "=")
	material, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	hm := func(key []byte, parts ...[]byte) []byte {
		m := hmac.New(sha256.New, key)
		for _, p := range parts {
			m.Write(p)
		}
		return m.Sum(nil)
	}
	sealKey := hm(material, []byte("mefor seal v1"))
	out := append([]byte("\x00mfe1"), byte(len(id)))
	out = append(out, id...)
	header := len(out)
	nonce := make([]byte, 24)
	rand.Read(nonce)
	out = append(out, nonce...)
	block, err := aes.NewCipher(hm(sealKey, nonce[:12]))
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	aad := append(append(append([]byte{}, out[:header]...), 0), col...)
	return gcm.Seal(out, nonce[12:], plain, aad)
}

// A store sealed by the release before row binding (mfe1) still reads
// after the upgrade; keys rotate re-seals it into the row-bound form and
// then marks the store sealed, and the queued delivery goes out intact.
func TestLegacyEnvelopesOpenAndAreResealedByRotate(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	k1 := newKeySpec(t, "k1")
	kr, err := crypt.Parse(k1)
	if err != nil {
		t.Fatal(err)
	}
	partnerAddr, listen := unusedAddr(t), unusedAddr(t)
	stop, err := startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true})
	if err != nil {
		t.Fatal(err)
	}
	sendMLLP(t, listen, phiMessage("L1", "PL0001", "LEGACY^PATIENT"))
	var msg, work int64
	cluster.Poll(t, 30*time.Second, "the queued delivery", func() bool {
		return db.Pool.QueryRow(ctx, `SELECT message_id, id FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`).Scan(&msg, &work) == nil
	})
	stop()

	// The store as the previous release left it: not marked sealed (a
	// node with keys marks only a new, empty store), its values in mfe1.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM mefor_sealed_store`); err != nil {
		t.Fatal(err)
	}
	var raw, payload []byte
	if err := db.Pool.QueryRow(ctx, `SELECT m.raw, w.payload FROM mefor_message m, mefor_work w WHERE m.id = $1 AND w.id = $2`, msg, work).Scan(&raw, &payload); err != nil {
		t.Fatal(err)
	}
	plainRaw, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(msg), raw)
	if err != nil {
		t.Fatal(err)
	}
	legacyRaw := sealV1(t, k1, pipeline.ColRaw, plainRaw)
	var legacyPayload []byte
	if payload != nil {
		plainPayload, err := kr.Open(pipeline.ColPayload, pipeline.MessageRow(msg), payload)
		if err != nil {
			t.Fatal(err)
		}
		legacyPayload = sealV1(t, k1, pipeline.ColPayload, plainPayload)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_message SET raw = $2 WHERE id = $1`, msg, legacyRaw); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_work SET payload = $2 WHERE id = $1`, work, legacyPayload); err != nil {
		t.Fatal(err)
	}

	if code, out, errs := cli(t, db.URL, k1, "messages", "show", fmt.Sprint(msg), "--body"); code != 0 || !strings.Contains(out, "LEGACY^PATIENT") {
		t.Fatalf("show --body of a legacy value: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli(t, db.URL, k1, "keys", "status"); code != 0 || !strings.Contains(out, "plaintext accepted until `mefor keys rotate` completes") {
		t.Fatalf("keys status before the rotation: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli(t, db.URL, k1, "keys", "rotate"); code != 0 || !strings.Contains(out, "sealed to its row") {
		t.Fatalf("keys rotate: exit %d\n%s%s", code, out, errs)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT raw FROM mefor_message WHERE id = $1`, msg).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(raw, crypt.BinaryHeader("k1")) {
		t.Fatalf("the legacy body was not re-sealed row-bound: %q", raw[:min(len(raw), 8)])
	}
	if _, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(msg+1), raw); !crypt.IsTampered(err) {
		t.Fatalf("the re-sealed body opens on another message's row: %v", err)
	}
	if code, out, errs := cli(t, db.URL, k1, "keys", "status"); code != 0 || !strings.Contains(out, "sealed store") {
		t.Fatalf("keys status after the rotation: exit %d\n%s%s", code, out, errs)
	}

	partner := newReplyingPartnerAt(t, partnerAddr)
	stop, err = startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cluster.Poll(t, 30*time.Second, "the delivery", func() bool { return len(partner.received()) == 1 })
	if got := partner.received()[0]; !bytes.Contains(got, []byte("LEGACY^PATIENT")) {
		t.Fatalf("delivered %q", got)
	}
}
