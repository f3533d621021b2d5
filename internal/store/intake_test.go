package store_test

import (
	"errors"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/leader"
)

func parsedInbound(channel, controlID, owner string) store.Inbound {
	return store.Inbound{Channel: channel, Source: "mllp", Raw: []byte("MSH|^~\\&|A|B|C|D|||ADT^A01|" + controlID + "|P|2.5.1\r"),
		ControlID: controlID, MessageType: "ADT", TriggerEvent: "A01", LeaseOwner: owner}
}

// A batch stored outside a transaction block commits at its end unless a
// statement raised: a node that does not hold the listener lease stores
// nothing, even though the batch went to the server whole, and a node that
// holds it stores everything, malformed messages included.
func TestReceiveBatchRefusedWithoutTheLeaseStoresNothing(t *testing.T) {
	f := newFixture(t)
	ins, err := river.NewClient(riverpgxv5.New(f.db.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.exec(`INSERT INTO mefor_leader_lease (key, owner, expires_at) VALUES ($1, 'node-b', now() + interval '1 hour')`,
		leader.ListenerLeaseKey)
	// A first message activates the lane, so the batches below are the one
	// round trip form.
	if _, err := store.ReceiveBatch(f.ctx, f.db.Pool, ins, []store.Inbound{parsedInbound("adt", "L0", "node-b")}); err != nil {
		t.Fatal(err)
	}
	malformed := store.Inbound{Channel: "adt", Source: "mllp", Raw: []byte("garbage"), ParseError: "not HL7", LeaseOwner: "node-a"}
	_, err = store.ReceiveBatch(f.ctx, f.db.Pool, ins, []store.Inbound{parsedInbound("adt", "L1", "node-a"), malformed})
	if !errors.Is(err, leader.ErrNotLeaseHolder) {
		t.Fatalf("batch of a node without the lease: %v, want ErrNotLeaseHolder", err)
	}
	if n := f.int(`SELECT count(*) FROM mefor_message`); n != 1 {
		t.Fatalf("%d messages stored, want only the first (the refused batch stores nothing)", n)
	}
	malformed.LeaseOwner = "node-b"
	ids, err := store.ReceiveBatch(f.ctx, f.db.Pool, ins, []store.Inbound{parsedInbound("adt", "L2", "node-b"), malformed})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND control_id = 'L2' AND status = 'received'`, ids[0]) +
		f.int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND status = 'error'`, ids[1]) +
		f.int(`SELECT count(*) FROM mefor_event WHERE message_id = $1 AND event IN ('received', 'failed')`, ids[1]); got != 4 {
		t.Fatalf("holder's batch: %d of 4 expected rows (parsed, malformed, its two events)", got)
	}
}

// A lane without a live drainer gets one, in the transaction that stores its
// message, and the message is stored once, with the id it would have had.
func TestReceiveBatchActivatesALaneWithoutDrainer(t *testing.T) {
	f := newFixture(t)
	ins, err := river.NewClient(riverpgxv5.New(f.db.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := store.ReceiveBatch(f.ctx, f.db.Pool, ins, []store.Inbound{parsedInbound("adt", "D1", ""), parsedInbound("lab", "D2", "")})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.int(`SELECT count(*) FROM mefor_message`); n != 2 {
		t.Fatalf("%d messages stored, want 2", n)
	}
	// The attempt that found no drainer failed before drawing any id.
	if ids[0] != 1 || ids[1] != 2 {
		t.Fatalf("ids %v in a fresh database, want [1 2]", ids)
	}
	if n := f.int(`SELECT count(*) FROM mefor_work WHERE message_id = ANY($1)`, ids); n != 2 {
		t.Fatalf("%d ingress rows, want 2", n)
	}
	if n := f.int(`SELECT count(DISTINCT l.name) FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name IN ('ingress:adt', 'ingress:lab') AND j.state = 'available'`); n != 2 {
		t.Fatalf("%d of the 2 lanes have a live drainer", n)
	}
}
