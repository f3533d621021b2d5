package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func parsedInbound(channel, controlID, owner string) pipeline.Inbound {
	return pipeline.Inbound{Channel: channel, Source: "mllp", Raw: []byte("MSH|^~\\&|A|B|C|D|||ADT^A01|" + controlID + "|P|2.5.1\r"),
		ControlID: controlID, MessageType: "ADT", TriggerEvent: "A01", LeaseOwner: owner}
}

// A batch stored outside a transaction block commits at its end unless a
// statement raised: a node that does not hold the listener lease stores
// nothing, even though the batch went to the server whole, and a node that
// holds it stores everything, malformed messages included.
func TestReceiveBatchRefusedWithoutTheLeaseStoresNothing(t *testing.T) {
	f := newFixture(t)
	ins, err := river.NewClient(riverpgxv5.New(f.DB.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.holdLease("node-b")
	// A first message activates the lane, so the batches below are the one
	// round trip form.
	if _, err := pipeline.ReceiveBatch(f.Ctx, f.DB.Pool, ins, []pipeline.Inbound{parsedInbound("adt", "L0", "node-b")}); err != nil {
		t.Fatal(err)
	}
	malformed := pipeline.Inbound{Channel: "adt", Source: "mllp", Raw: []byte("garbage"), ParseError: "not HL7", LeaseOwner: "node-a"}
	_, err = pipeline.ReceiveBatch(f.Ctx, f.DB.Pool, ins, []pipeline.Inbound{parsedInbound("adt", "L1", "node-a"), malformed})
	if !errors.Is(err, leader.ErrNotLeaseHolder) {
		t.Fatalf("batch of a node without the lease: %v, want ErrNotLeaseHolder", err)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_message`); n != 1 {
		t.Fatalf("%d messages stored, want only the first (the refused batch stores nothing)", n)
	}
	malformed.LeaseOwner = "node-b"
	ids, err := pipeline.ReceiveBatch(f.Ctx, f.DB.Pool, ins, []pipeline.Inbound{parsedInbound("adt", "L2", "node-b"), malformed})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND control_id = 'L2' AND status = 'received'`, ids[0]) +
		f.Int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND status = 'error'`, ids[1]) +
		f.Int(`SELECT count(*) FROM mefor_event WHERE message_id = $1 AND event IN ('received', 'failed')`, ids[1]); got != 4 {
		t.Fatalf("holder's batch: %d of 4 expected rows (parsed, malformed, its two events)", got)
	}
}

// A lane without a live drainer gets one, in the transaction that stores its
// message, and the message is stored once, with the id it would have had.
func TestReceiveBatchActivatesALaneWithoutDrainer(t *testing.T) {
	f := newFixture(t)
	ins, err := river.NewClient(riverpgxv5.New(f.DB.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pipeline.ReceiveBatch(f.Ctx, f.DB.Pool, ins, []pipeline.Inbound{parsedInbound("adt", "D1", ""), parsedInbound("lab", "D2", "")})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_message`); n != 2 {
		t.Fatalf("%d messages stored, want 2", n)
	}
	// The attempt that found no drainer failed before drawing any id.
	if ids[0] != 1 || ids[1] != 2 {
		t.Fatalf("ids %v in a fresh database, want [1 2]", ids)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_work WHERE message_id = ANY($1)`, ids); n != 2 {
		t.Fatalf("%d ingress rows, want 2", n)
	}
	if n := f.Int(`SELECT count(DISTINCT l.name) FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name IN ('ingress:adt', 'ingress:lab') AND j.state = 'available'`); n != 2 {
		t.Fatalf("%d of the 2 lanes have a live drainer", n)
	}
}

// A batch whose lanes all have a live drainer is stored in one round trip
// to the server, lease check included: the ACK of a sender on one
// connection waits for nothing else. A lane without one costs a second
// trip, the transaction that activates it.
func TestReceiveBatchToLiveLanesIsOneRoundTrip(t *testing.T) {
	f := newFixture(t)
	trips := &testcontainers.RoundTrips{}
	pool, ins := f.tracedIntake(trips)
	f.holdLease("node-a")
	if _, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, []pipeline.Inbound{parsedInbound("adt", "A0", "node-a"), parsedInbound("lab", "B0", "node-a")}); err != nil {
		t.Fatal(err)
	}

	trips.N.Store(0)
	batch := []pipeline.Inbound{parsedInbound("adt", "A1", "node-a"), parsedInbound("lab", "B1", "node-a"), parsedInbound("adt", "A2", "node-a")}
	ids, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, batch)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.N.Load(); n != 1 {
		t.Errorf("a batch of 3 to lanes with live drainers took %d round trips, want 1", n)
	}
	for i, in := range batch {
		if n := f.Int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND control_id = $2`, ids[i], in.ControlID); n != 1 {
			t.Errorf("message %s not stored under id %d", in.ControlID, ids[i])
		}
	}

	trips.N.Store(0)
	if _, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, []pipeline.Inbound{parsedInbound("orm", "C0", "node-a")}); err != nil {
		t.Fatal(err)
	}
	if n := trips.N.Load(); n < 2 {
		t.Errorf("a lane without a drainer was stored in %d round trips; the refusal and the activation take 2 or more", n)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_message WHERE control_id = 'C0'`); n != 1 {
		t.Errorf("C0 stored %d times, want 1", n)
	}
}

// statementLog is a pgx tracer that records each statement sent, and
// whether its connection was inside a transaction block when it was; the
// rest of the tracer is testcontainers.RoundTrips.
type statementLog struct {
	testcontainers.RoundTrips
	mu    sync.Mutex
	stmts []loggedStatement
}

type loggedStatement struct {
	sql  string
	inTx bool
}

func (l *statementLog) add(conn *pgx.Conn, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, loggedStatement{sql: sql, inTx: conn.PgConn().TxStatus() != 'I'})
}

func (l *statementLog) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(conn, d.SQL)
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(conn, d.SQL)
}

func (l *statementLog) take() []loggedStatement {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stmts
	l.stmts = nil
	return s
}

// A message that activates its lane is announced to River's producers
// after its transaction commits, not inside it: PostgreSQL commits
// notifying transactions one at a time, each holding its notification lock
// across its WAL flush, so a burst of activations (a node's start, many
// quiet interfaces waking) made each sender's ACK wait for the others'
// fsyncs. The announcement still reaches River's producers when River's own
// is skipped.
func TestActivatingIntakeAnnouncesAfterItsCommit(t *testing.T) {
	f := newFixture(t)
	log := &statementLog{}
	pool := f.DB.TracedPool(t, log)
	// Intake's inserter, as a node has it: River's own notification, sent
	// inside the transaction, is left out.
	ins, err := jobs.NewQuietInserter(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := f.DB.Pool.Acquire(f.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	var channel string
	if err := listener.QueryRow(f.Ctx, `SELECT current_schema() || '.river_insert'`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := listener.Exec(f.Ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	// The first message of a lane activates it.
	if _, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, []pipeline.Inbound{parsedInbound("lab", "N1", "")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.Ctx, 10*time.Second)
	n, err := listener.Conn().WaitForNotification(ctx)
	cancel()
	if err != nil {
		t.Fatalf("lane ingress:lab activated: no notification for River's producers (%v)", err)
	}
	wctx, cancel := context.WithTimeout(f.Ctx, 500*time.Millisecond)
	defer cancel()
	if n, err := listener.Conn().WaitForNotification(wctx); err == nil {
		t.Errorf("a second notification %q: the activation was announced twice", n.Payload)
	}
	if want := `{"queue": "` + jobs.QueueIngress + `"}`; n.Payload != want {
		t.Fatalf("activation announced %q, want %q", n.Payload, want)
	}
	if k := f.Int(`SELECT count(*) FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = 'ingress:lab' AND j.state = 'available'`); k != 1 {
		t.Fatalf("lane ingress:lab has %d live drainers, want 1", k)
	}

	committed, announced := -1, -1
	for i, s := range log.take() {
		notifies := strings.Contains(s.sql, "pg_notify")
		switch {
		case notifies && s.inTx:
			t.Errorf("statement %d notifies inside the storing transaction: %s", i, s.sql)
		case notifies:
			announced = i
		case strings.HasPrefix(strings.ToLower(strings.TrimSpace(s.sql)), "commit"):
			committed = i
		}
	}
	if committed < 0 || announced < committed {
		t.Fatalf("storing transaction committed at statement %d, announcement at %d: want the announcement after the commit", committed, announced)
	}
}

// With encryption on, a batch's message ids are drawn before its one round
// trip (its bodies are sealed bound to them); drawn a block at a time, a
// batch that finds ids left costs the one round trip alone. The stored
// bodies open under their own message's id only.
func TestSealedIntakeDrawsIdsAheadABlockAtATime(t *testing.T) {
	f := newFixture(t)
	trips := &testcontainers.RoundTrips{}
	pool, ins := f.tracedIntake(trips)
	kr := fixtures.Keyring(t, "k1")
	f.holdLease("node-a")
	ids := &pipeline.MessageIDs{Block: 8, MaxAge: time.Minute}
	sealed := func(ch, ctrl string) pipeline.Inbound {
		in := parsedInbound(ch, ctrl, "node-a")
		in.Keys, in.IDs = kr, ids
		return in
	}
	if _, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, []pipeline.Inbound{sealed("adt", "A0")}); err != nil {
		t.Fatal(err) // activates the lane
	}
	trips.N.Store(0)
	batch := []pipeline.Inbound{sealed("adt", "A1"), sealed("adt", "A2")}
	got, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, batch)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.N.Load(); n != 1 {
		t.Errorf("a sealed batch with ids left in the block took %d round trips, want 1", n)
	}
	if got[0] >= got[1] {
		t.Errorf("ids %v do not follow the batch's order", got)
	}
	for i, in := range batch {
		var raw []byte
		if err := pool.QueryRow(f.Ctx, `SELECT raw FROM mefor_message WHERE id = $1 AND control_id = $2`, got[i], in.ControlID).Scan(&raw); err != nil {
			t.Fatalf("message %s not stored under id %d: %v", in.ControlID, got[i], err)
		}
		if body, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(got[i]), raw); err != nil || !bytes.Equal(body, in.Raw) {
			t.Errorf("message %d's body does not open under its id: %v", got[i], err)
		}
		if _, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(got[1-i]), raw); !crypt.IsTampered(err) {
			t.Errorf("message %d's body opens under another message's id: %v", got[i], err)
		}
	}
	// The block used up, the next batch draws again first.
	trips.N.Store(0)
	var more []pipeline.Inbound
	for i := range 6 {
		more = append(more, sealed("adt", fmt.Sprintf("B%d", i)))
	}
	if _, err := pipeline.ReceiveBatch(f.Ctx, pool, ins, more); err != nil {
		t.Fatal(err)
	}
	if n := trips.N.Load(); n != 2 {
		t.Errorf("a sealed batch past the block took %d round trips, want 2 (the draw, the batch)", n)
	}
}
