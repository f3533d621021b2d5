package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// twoChannelNode starts a node with channels ch0 and ch1, both delivering to
// one partner, and returns their listen addresses.
func twoChannelNode(t *testing.T, db *testcontainers.DB) (*engine.Node, [2]string) {
	t.Helper()
	p := newPartner(t, "", nil)
	var addrs [2]string
	var y strings.Builder
	y.WriteString("cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}\nchannels:\n")
	for i := range addrs {
		addrs[i] = fixtures.FreeAddr(t)
		fmt.Fprintf(&y, "  ch%d:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, handler: passthrough, destinations: [d]}\n", i, addrs[i])
	}
	fmt.Fprintf(&y, "destinations:\n  d: {type: mllp, mllp: {address: %q}}\n", p.addr)
	cfg, err := config.Parse(filepath.Join(t.TempDir(), "mefor.yaml"), []byte(y.String()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.StartNode(t, db, cfg, nil), addrs
}

type sent struct {
	ack hl7.Ack
	err error
}

// sendAsync sends msg on a connection of its own and reports the answer.
func sendAsync(t *testing.T, addr string, msg []byte) <-chan sent {
	t.Helper()
	out := make(chan sent, 1)
	go func() {
		c := &mllp.Client{Addr: addr, AckTimeout: 30 * time.Second}
		defer c.Close()
		raw, err := c.Send(context.Background(), msg)
		if err != nil {
			out <- sent{err: err}
			return
		}
		ack, err := hl7.ParseACK(raw)
		out <- sent{ack: ack, err: err}
	}()
	return out
}

// noAnswerYet fails the test if any of the senders got an answer.
func noAnswerYet(t *testing.T, senders map[string]<-chan sent) {
	t.Helper()
	for name, ch := range senders {
		select {
		case r := <-ch:
			t.Fatalf("%s answered %+v before its commit", name, r)
		default:
		}
	}
}

// Messages arriving on several connections and channels while a commit is in
// flight wait for it, are then stored together in one transaction, and none
// is acknowledged before its commit. A message the database refuses (here
// by a trigger the test installs) fails alone: the messages it was batched
// with are stored on their own and acknowledged.
func TestIntakeGroupCommitAcksOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	n, addrs := twoChannelNode(t, db)
	var mu sync.Mutex
	var batches []int
	engine.SetCommitHook(n.Intake(), func(m int) {
		mu.Lock()
		batches = append(batches, m)
		mu.Unlock()
	})
	// Warm up: both lanes get their drainers.
	for i, a := range addrs {
		if r := <-sendAsync(t, a, adt(fmt.Sprintf("W%d", i), "P0")); r.err != nil || r.ack.Code != hl7.AckAccept {
			t.Fatalf("warm-up message: %+v", r)
		}
	}
	mu.Lock()
	batches = nil
	mu.Unlock()
	// The node's intake metrics split each ACK into the wait for a commit
	// and the commit itself.
	const slow = 0.25 // seconds: a bucket bound below the 300ms hold
	wait0 := histogramOf(t, n, "mefor_intake_commit_wait_seconds", slow)
	commit0 := histogramOf(t, n, "mefor_intake_commit_seconds", slow)
	size0 := histogramOf(t, n, "mefor_intake_commit_messages", 64)
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION test_refuse_gc_x() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.control_id = 'GC-X' THEN RAISE EXCEPTION 'this test refuses GC-X'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_refuse_gc_x BEFORE INSERT ON mefor_message
			FOR EACH ROW EXECUTE FUNCTION test_refuse_gc_x();`); err != nil {
		t.Fatal(err)
	}

	// Hold ch0's lane lock: the next commit that writes to ch0 waits on it.
	// On a session of its own that no idle timeout ends while the test
	// looks at the senders.
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET idle_in_transaction_session_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	hold, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if err := jobs.LockLanes(ctx, hold, []string{jobs.IngressLane("ch0")}); err != nil {
		t.Fatal(err)
	}
	a := sendAsync(t, addrs[0], adt("GC-A", "P1"))
	// A's commit has started (alone: nobody else was sending) and cannot
	// end while the lock is held.
	fixtures.Eventually(t, 20*time.Second, "the commit of A started", func() bool {
		noAnswerYet(t, map[string]<-chan sent{"A": a})
		mu.Lock()
		defer mu.Unlock()
		return len(batches) == 1
	})
	b := sendAsync(t, addrs[1], adt("GC-B", "P2"))
	fixtures.Eventually(t, 20*time.Second, "B queued behind A's commit", func() bool {
		noAnswerYet(t, map[string]<-chan sent{"A": a, "B": b})
		return engine.QueuedIntake(n.Intake()) == 1
	})
	x := sendAsync(t, addrs[1], adt("GC-X", "P3"))
	fixtures.Eventually(t, 20*time.Second, "X queued behind A's commit", func() bool {
		noAnswerYet(t, map[string]<-chan sent{"A": a, "B": b, "X": x})
		return engine.QueuedIntake(n.Intake()) == 2
	})
	// Nothing is committed, so nobody may have an answer.
	time.Sleep(300 * time.Millisecond)
	noAnswerYet(t, map[string]<-chan sent{"A": a, "B": b, "X": x})
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan sent{"A": a, "B": b} {
		if r := <-ch; r.err != nil || r.ack.Code != hl7.AckAccept {
			t.Errorf("%s answered %+v, want AA", name, r)
		}
	}
	if r := <-x; r.err == nil {
		t.Errorf("X, which the database refuses, answered %+v; want no answer", r.ack)
	}
	for _, id := range []string{"GC-A", "GC-B"} {
		if got := queryStrings(t, db, `SELECT status FROM mefor_message WHERE control_id = $1`, id); len(got) != 1 {
			t.Errorf("%s stored %d times, want once", id, len(got))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// A alone (nobody else was there), then B and X together; the batch
	// refused for X is then stored message by message.
	if !slices.Equal(batches, []int{1, 2, 1, 1}) {
		t.Errorf("intake commits carried %v messages, want [1 2 1 1]", batches)
	}
	// A's commit waited on the lock, B and X waited for A's commit to end;
	// the four commits are counted with their sizes.
	if h := histogramOf(t, n, "mefor_intake_commit_seconds", slow).minus(commit0); h.count != 4 || h.above < 1 {
		t.Errorf("mefor_intake_commit_seconds: %d commits, %d over %vs; want 4, at least 1 (A's)", h.count, h.above, slow)
	}
	if h := histogramOf(t, n, "mefor_intake_commit_wait_seconds", slow).minus(wait0); h.count != 3 || h.above != 2 {
		t.Errorf("mefor_intake_commit_wait_seconds: %d messages, %d over %vs; want 3, 2 (B and X)", h.count, h.above, slow)
	}
	if h := histogramOf(t, n, "mefor_intake_commit_messages", 64).minus(size0); h.count != 4 || h.sum != 5 {
		t.Errorf("mefor_intake_commit_messages: %d commits of %v messages in all; want 4 of 5", h.count, h.sum)
	}
}

// Many synchronous senders on several channels at once: their messages are
// stored in fewer transactions than messages, and in each lane seq order is
// arrival order: it follows the message ids, and each connection's messages
// keep the order it sent them in.
func TestIntakeGroupCommitKeepsLaneOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	n, addrs := twoChannelNode(t, db)
	var mu sync.Mutex
	commits := 0
	engine.SetCommitHook(n.Intake(), func(int) {
		mu.Lock()
		commits++
		mu.Unlock()
	})
	const conns, perConn = 6, 40
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Go(func() {
			c := &mllp.Client{Addr: addrs[i%2], AckTimeout: 30 * time.Second}
			defer c.Close()
			for j := range perConn {
				raw, err := c.Send(ctx, adt(fmt.Sprintf("O%d-%03d", i, j), "P1"))
				if ack, perr := hl7.ParseACK(raw); err != nil || perr != nil || ack.Code != hl7.AckAccept {
					errs <- errors.Join(err, perr, fmt.Errorf("connection %d message %d not acknowledged", i, j))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	if commits >= conns*perConn {
		t.Errorf("%d messages took %d intake commits; want them batched", conns*perConn, commits)
	}
	mu.Unlock()

	rows, err := db.Pool.Query(ctx, `
		SELECT w.lane, m.control_id, m.id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.stage = 'ingress' ORDER BY w.lane, w.seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Lane, Ctrl string
		ID         int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != conns*perConn {
		t.Fatalf("%d ingress rows, want %d", len(got), conns*perConn)
	}
	last := map[string]string{}
	for i, r := range got {
		if i > 0 && got[i-1].Lane == r.Lane && got[i-1].ID > r.ID {
			t.Fatalf("lane %s: %s (id %d) has a later seq than %s (id %d)", r.Lane, got[i-1].Ctrl, got[i-1].ID, r.Ctrl, r.ID)
		}
		conn := r.Ctrl[:strings.Index(r.Ctrl, "-")]
		if prev, ok := last[conn]; ok && prev > r.Ctrl {
			t.Fatalf("lane %s: %s is served after %s", r.Lane, prev, r.Ctrl)
		}
		last[conn] = r.Ctrl
	}
}
