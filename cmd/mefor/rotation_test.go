package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/rotation"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func keysStatus(t *testing.T, db *testcontainers.DB, keys string) ops.KeyStatus {
	t.Helper()
	code, out, errs := cli(t, db.URL, keys, "keys", "status", "--json")
	if code != 0 {
		t.Fatalf("keys status: exit %d\n%s%s", code, out, errs)
	}
	var st ops.KeyStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("keys status --json: %v\n%s", err, out)
	}
	// The census an operator gets through mefor_key_census is the one the
	// tables give, from one snapshot.
	ctx := context.Background()
	err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		viaFunction, err := rotation.KeyCensus(ctx, tx)
		if err != nil {
			return err
		}
		direct, err := rotation.KeyCensusDirect(ctx, tx)
		if err != nil {
			return err
		}
		if fmt.Sprint(viaFunction) != fmt.Sprint(direct) {
			t.Errorf("mefor_key_census %v, the tables %v", viaFunction, direct)
		}
		// And so is the count of values a sealed store refuses.
		unbound, err := rotation.Unbound(ctx, tx)
		if err != nil {
			return err
		}
		unboundDirect, err := rotation.UnboundDirect(ctx, tx)
		if err != nil {
			return err
		}
		if unbound != unboundDirect {
			t.Errorf("mefor_unbound_count %d, the tables %d", unbound, unboundDirect)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A database that ran without keys, then under k1, is rotated to k2 while
// a node runs under k2,k1 and traffic keeps flowing; after that k1 can be
// dropped and everything still reads, old messages included.
func TestKeyRotationWithNodesRunning(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	k1, k2 := newKeySpec(t, "k1"), newKeySpec(t, "k2")
	partner := newReplyingPartner(t)
	listen := unusedAddr(t)
	n := 0
	sendSome := func(count int) {
		t.Helper()
		var msgs [][]byte
		for range count {
			n++
			msgs = append(msgs, phiMessage(fmt.Sprintf("R%d", n), fmt.Sprintf("PR%04d", n), "ROTA^PAT"))
		}
		sendMLLP(t, listen, msgs...)
	}
	delivered := func(want int) {
		t.Helper()
		cluster.Poll(t, 60*time.Second, fmt.Sprintf("%d deliveries", want), func() bool { return len(partner.received()) >= want })
	}
	// One patient comes back in every phase: the script counts visits in
	// state keyed by the patient id, so the count shows that state keys
	// stay found across encryption being turned on and keys rotated.
	visits := 0
	visit := func() {
		t.Helper()
		visits++
		before := len(partner.received())
		sendMLLP(t, listen, phiMessage(fmt.Sprintf("V%d", visits), "PVISIT01", "RETURNING^PAT"))
		cluster.Poll(t, 60*time.Second, "the visit's delivery", func() bool {
			for _, m := range partner.received()[before:] {
				if bytes.Contains(m, []byte(fmt.Sprintf("|V%d|", visits))) {
					return true
				}
			}
			return false
		})
		for _, m := range partner.received()[before:] {
			if bytes.Contains(m, []byte(fmt.Sprintf("|V%d|", visits))) && !bytes.Contains(m, []byte(fmt.Sprintf("ZVC|%d", visits))) {
				t.Fatalf("visit %d delivered with the wrong count (state key lost?):\n%q", visits, m)
			}
		}
	}

	// Plaintext, then k1.
	stop := phiNode(t, db, "", listen, partner.addr)
	sendSome(5)
	delivered(5)
	visit()
	stop()
	stop = phiNode(t, db, k1, listen, partner.addr)
	sendSome(5)
	delivered(11)
	visit()
	stop()
	if st := keysStatus(t, db, k1); st.ByKey[""] == 0 || st.ByKey["k1"] == 0 {
		t.Fatalf("before rotation: %+v; want plaintext and k1 values", st.ByKey)
	}

	// k2 active, k1 still readable: rotate while traffic flows.
	ring := k2 + "," + k1
	stop = phiNode(t, db, ring, listen, partner.addr)
	visit()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	sent := make(chan int, 1)
	wg.Go(func() {
		count := 0
		for ctx.Err() == nil {
			count++
			m := phiMessage(fmt.Sprintf("T%d", count), fmt.Sprintf("PT%04d", count), "DURING^PAT")
			c := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second}
			if _, err := c.Send(ctx, m); err != nil {
				count--
			}
			c.Close()
			time.Sleep(20 * time.Millisecond)
		}
		sent <- count
	})
	var rotations []string
	for range 4 {
		code, out, errs := cli(t, db.URL, ring, "keys", "rotate", "--batch-size", "7")
		if code != 0 {
			cancel()
			t.Fatalf("keys rotate: exit %d\n%s%s", code, out, errs)
		}
		rotations = append(rotations, out)
		if st := keysStatus(t, db, ring); st.Pending == 0 {
			break
		}
	}
	cancel()
	wg.Wait()
	during := <-sent
	t.Logf("rotation runs: %q; %d messages sent during them", rotations, during)
	if !strings.Contains(rotations[0], "re-encrypted") || !strings.Contains(rotations[0], "plaintext:") || !strings.Contains(rotations[0], "k1:") {
		t.Fatalf("first rotation said %q", rotations[0])
	}
	st := keysStatus(t, db, ring)
	if st.Pending != 0 || st.ByKey["k1"] != 0 || st.ByKey[""] != 0 || len(st.Droppable) != 1 || st.Droppable[0] != "k1" {
		t.Fatalf("after rotation: %+v; want everything under k2 and k1 droppable", st)
	}
	delivered(13 + during)
	visit()
	stop()

	// k1 dropped: the node and the CLI read everything with k2 alone.
	stop = phiNode(t, db, k2, listen, partner.addr)
	sendSome(1)
	delivered(14 + during + 1)
	visit()
	for _, id := range []string{"1", "7"} { // a plaintext-era and a k1-era message
		code, out, errs := cli(t, db.URL, k2, "messages", "show", id, "--body")
		if code != 0 || !strings.Contains(out, "ROTA^PAT") || !strings.Contains(out, "filed for ROTA") {
			t.Fatalf("show %s --body with k2 only: exit %d\n%s%s", id, code, out, errs)
		}
	}
	for pid, ctrl := range map[string]string{"PR0002": "R2", "PR0008": "R8"} {
		code, out, errs := cli(t, db.URL, k2, "messages", "list", "--patient", pid, "--json")
		var found []struct {
			ControlID string `json:"control_id"`
		}
		if err := json.Unmarshal([]byte(out), &found); code != 0 || err != nil || len(found) != 1 || found[0].ControlID != ctrl {
			t.Fatalf("list --patient %s with k2 only: exit %d, %v\n%s%s", pid, code, err, out, errs)
		}
	}
	recs, err := audit.List(context.Background(), db.Pool, audit.Filter{Action: audit.ActionKeysRotate, Limit: 1000})
	if err != nil || len(recs) < 3 {
		t.Fatalf("keys-rotate audit rows: %d, %v", len(recs), err)
	}
	if v, err := audit.Verify(context.Background(), db.Pool, nil); err != nil || !v.OK() {
		t.Fatalf("audit verify: %+v, %v", v, err)
	}
}

// A rotation that meets a value no key of its ring opens fails naming the
// key, and its batch writes nothing: the plaintext before that value in
// the same batch stays as it was.
func TestRotationStopsAtAValueItCannotOpen(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	k1, k2 := newKeySpec(t, "k1"), newKeySpec(t, "k2")
	partner := newReplyingPartner(t)
	listen := unusedAddr(t)
	stop := phiNode(t, db, "", listen, partner.addr)
	sendMLLP(t, listen, phiMessage("P1", "PA0001", "PLAIN^PAT"))
	cluster.Poll(t, 30*time.Second, "delivery", func() bool { return len(partner.received()) == 1 })
	stop()
	stop = phiNode(t, db, k1, listen, partner.addr)
	sendMLLP(t, listen, phiMessage("S1", "PA0002", "SEALED^PAT"))
	cluster.Poll(t, 30*time.Second, "delivery", func() bool { return len(partner.received()) == 2 })
	stop()

	before := keysStatus(t, db, k2)
	code, out, errs := cli(t, db.URL, k2, "keys", "rotate")
	if code == 0 || !strings.Contains(errs, `key "k1"`) || !strings.Contains(errs, "mefor_message.raw") {
		t.Fatalf("rotate without k1: exit %d, want an error naming k1 and the column\n%s%s", code, out, errs)
	}
	after := keysStatus(t, db, k2)
	if !bytes.Equal(mustJSON(t, before.Counts), mustJSON(t, after.Counts)) {
		t.Fatalf("the failed batch changed values:\nbefore %+v\nafter  %+v", before.Counts, after.Counts)
	}
}

// A node whose ring lacks the key its queued rows are sealed under sends
// nothing (never garbage) and says which key it needs; given the key, it
// delivers them as they came.
func TestMissingKeyStopsTheLaneNamingTheKey(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	k1, k2 := newKeySpec(t, "k1"), newKeySpec(t, "k2")
	partnerAddr := unusedAddr(t) // down for now
	listen := unusedAddr(t)
	stop, err := startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr, plain: true})
	if err != nil {
		t.Fatal(err)
	}
	sendMLLP(t, listen, phiMessage("M1", "PM0001", "MISSING^KEY"))
	cluster.Poll(t, 30*time.Second, "the outbound row", func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`).Scan(&n)
		return n == 1
	})
	stop()

	partner := newReplyingPartnerAt(t, partnerAddr)
	var logs fixtures.SyncBuffer
	stop, err = startPHINode(t, db, phiOpts{keys: k2, listen: listen, partner: partnerAddr, plain: true, log: &logs})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("node log:\n%s", logs.String())
			rows, _ := db.Pool.Query(context.Background(), `SELECT id, kind, state, attempt, coalesce(scheduled_at::text,''), args::text, coalesce(errors::text,'') FROM river_job`)
			for rows.Next() {
				v, _ := rows.Values()
				t.Logf("job %v", v)
			}
		}
	}()
	cluster.Poll(t, 10*time.Second, "the node saying which key it needs", func() bool {
		return strings.Contains(logs.String(), `key \"k1\"`) || strings.Contains(logs.String(), "k1")
	})
	time.Sleep(time.Second)
	if got := partner.received(); len(got) != 0 {
		t.Fatalf("a node without the key sent %q", got)
	}
	if strings.Contains(logs.String(), "MISSING") {
		t.Fatal("the node logged message content")
	}
	stop()

	// A node whose reference set is sealed under a key it lacks does not
	// start, and says which key.
	if _, err := startPHINode(t, db, phiOpts{keys: k1, listen: listen, partner: partnerAddr}); err != nil {
		t.Fatal(err)
	}
	if _, err := startPHINode(t, db, phiOpts{keys: k2, listen: unusedAddr(t), partner: partnerAddr}); err == nil ||
		!strings.Contains(err.Error(), `key "k1"`) {
		t.Fatalf("a node without the reference set's key started: %v", err)
	}

	cluster.Poll(t, 30*time.Second, "the delivery once the key is back", func() bool { return len(partner.received()) == 1 })
	if got := partner.received()[0]; !bytes.Contains(got, []byte("MISSING^KEY")) {
		t.Fatalf("delivered %q", got)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
