package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Intake: what a node stores of each message it receives, and when and how
// it answers the sender. Nothing is acknowledged before its commit, and the
// messages that arrive while a commit is in flight share the next one; a
// message that is not HL7 is answered AR and kept for inspection; the
// patient is stored for search. The node's sessions are checked here too:
// intake's durability depends on them.

// A message that is not HL7 is answered AR with the reason, kept with status
// error and its raw bytes for inspection, and the connection stays usable:
// the next, valid message on it is answered AA and delivered.
func TestMalformedMessageRejectedAndConnectionKeepsWorking(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, p, listen := startDownstream(t, db, nil, nil)

	garbage := []byte("this is not an HL7 message\rPID|1||X")
	c := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second}
	defer c.Close()
	raw, err := c.Send(context.Background(), garbage)
	if err != nil {
		t.Fatalf("send malformed message: %v", err)
	}
	ack, err := hl7.ParseACK(raw)
	if err != nil {
		t.Fatalf("answer to the malformed message is not an ACK: %v\n%q", err, raw)
	}
	if ack.Code != hl7.AckReject || !strings.Contains(ack.Text, "does not start with an MSH segment") {
		t.Fatalf("malformed message answered %s %q, want AR with the reason", ack.Code, ack.Text)
	}

	raw, err = c.Send(context.Background(), adt("M001", "P1"))
	if err != nil {
		t.Fatalf("send valid message on the same connection: %v", err)
	}
	if ack, err := hl7.ParseACK(raw); err != nil || ack.Code != hl7.AckAccept || ack.ControlID != "M001" {
		t.Fatalf("valid message answered %+v (%v), want AA for M001", ack, err)
	}
	fixtures.Eventually(t, 20*time.Second, "valid message delivered", func() bool { return len(p.acceptedIDs()) == 1 })

	var status, errText string
	var body []byte
	var work int
	err = db.Pool.QueryRow(context.Background(), `
		SELECT status, coalesce(error, ''), raw, (SELECT count(*) FROM mefor_work w WHERE w.message_id = m.id)
		FROM mefor_message m WHERE control_id IS NULL`).Scan(&status, &errText, &body, &work)
	if err != nil {
		t.Fatalf("stored malformed message: %v", err)
	}
	if status != "error" || !strings.Contains(errText, "not a valid HL7 v2 message") || !bytes.Equal(body, garbage) || work != 0 {
		t.Fatalf("malformed message stored as status %s, error %q, body %q, %d work rows; want error, the reason, the raw bytes, none",
			status, errText, body, work)
	}
	fixtures.Eventually(t, 10*time.Second, "valid message processed", func() bool { return messageStatus(t, db, "M001") == "processed" })
}

// When the database cannot store a message the sender never gets AA: the
// connection closes without an answer (or the answer is negative), so the
// sender keeps the message and sends it again.
func TestDatabaseUnreachableNeverAcknowledged(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  archive:
    type: file
    file: {directory: "%s"}
`, t.TempDir()))
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.StopTimeout = 500 * time.Millisecond })

	if ack, err := sendOne(listen, adt("U000", "P1")); err != nil || ack.Code != hl7.AckAccept {
		t.Fatalf("before the outage: %+v, %v; want AA", ack, err)
	}
	// The database goes away for good: connections are cut and new ones
	// refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.Server.DropDB(ctx, db.Name); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		ack, err := sendOne(listen, adt(fmt.Sprintf("U%03d", i+1), "P1"))
		if err == nil && ack.Code.IsAccept() {
			t.Fatalf("message %d acknowledged %s although the database is gone", i+1, ack.Code)
		}
		t.Logf("message %d: ack %q, error %v", i+1, ack.Code, err)
	}
}

// A node's sessions carry what the cluster relies on, however the node is
// started: a name the other nodes can end them by once it is dead, and an
// end to a transaction it leaves idle (frozen or cut off) after lease_ttl.
func TestNodeSessionsNamedAndBounded(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	n := cluster.StartNode(t, db, idleConfig(t), named("sessions-node"))
	var name, idle, syncCommit, serverDefault string
	if err := n.Pool().QueryRow(context.Background(),
		`SELECT current_setting('application_name'), current_setting('idle_in_transaction_session_timeout'),
			current_setting('synchronous_commit')`).Scan(&name, &idle, &syncCommit); err != nil {
		t.Fatal(err)
	}
	if name != "mefor sessions-node" || idle != "5s" {
		t.Fatalf("node session: application_name %q, idle_in_transaction_session_timeout %q; want \"mefor sessions-node\" and the 5s lease_ttl", name, idle)
	}
	// The suite's server commits without waiting for the flush; a node's
	// sessions must not, or an ACK could precede the message's durability.
	if err := db.Pool.QueryRow(context.Background(), `SELECT current_setting('synchronous_commit')`).Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	if serverDefault != "off" {
		t.Fatalf("the suite's server default synchronous_commit is %q; this test needs it off", serverDefault)
	}
	if syncCommit != "on" {
		t.Fatalf("node session: synchronous_commit %q on a server whose default is off; want on", syncCommit)
	}
}

// A sender's header in Latin-1 (bytes that are not UTF-8), or with a NUL in
// it, is still stored and acknowledged: PostgreSQL refuses such text, and
// a message that cannot be stored is never ACKed, so the sender would
// resend it forever. The body is kept and delivered byte for byte.
func TestHeaderNotUTF8StoredAndAcknowledged(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, p, listen := startDownstream(t, db, nil, nil)

	latin1 := bytes.Replace(adt("L001", "P\xe91"), []byte("|HOSP|"), []byte("|H\xd4PITAL\x00|"), 1)
	for _, ack := range send(t, listen, latin1, adt("L002", "P2")) {
		if ack.Code != hl7.AckAccept {
			t.Fatalf("answered %+v, want AA", ack)
		}
	}
	fixtures.Eventually(t, 20*time.Second, "both delivered", func() bool { return len(p.acceptedIDs()) == 2 })
	if got := p.acceptedIDs(); got[0] != "L001" || got[1] != "L002" {
		t.Fatalf("delivered %v, want [L001 L002]", got)
	}
	var body []byte
	var facility string
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT raw, sending_facility FROM mefor_message WHERE control_id = 'L001'`).Scan(&body, &facility); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, latin1) {
		t.Fatalf("stored body differs from what was sent")
	}
	if facility != "H\uFFFDPITAL\uFFFD" {
		t.Fatalf("sending_facility stored as %q", facility)
	}
}

// A node on a server that is not crash-safe says so at start: the suite's
// server runs with fsync and full_page_writes off.
func TestNodeWarnsOfServerThatIsNotCrashSafe(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	logs := newLogWatch(fixtures.Logger(t).Handler(), "the database server is not crash-safe")
	cluster.StartNode(t, db, idleConfig(t), func(o *engine.Options) { o.Logger = slog.New(logs) })
	if logs.count("the database server is not crash-safe") != 1 {
		t.Fatal("a node on a server with fsync off did not warn, once, at start")
	}
}

// A database URL naming synchronous_commit=off is used as given (an
// operator's explicit choice), but the node says at start what it costs;
// without it, on the same server, it says nothing of the kind. (Each node
// is stopped here and again by cluster.StartNode's cleanup: a second Stop is
// harmless.)
func TestNodeWarnsOfCommitsThatDoNotWait(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	const warning = "the node's sessions commit without waiting for the flush"
	for _, c := range []struct {
		url  string
		want int
	}{{db.URL, 0}, {db.URL + "&synchronous_commit=off", 1}} {
		pool, err := pgxpool.New(context.Background(), c.url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		logs := newLogWatch(fixtures.Logger(t).Handler(), warning)
		n := cluster.StartNode(t, db, idleConfig(t), func(o *engine.Options) {
			o.Logger = slog.New(logs)
			o.Pool = pool
			o.NodeID = fmt.Sprintf("sync-%d", c.want)
		})
		if got := logs.count(warning); got != c.want {
			t.Errorf("node on %s: warned %d times that commits do not wait, want %d", strings.TrimPrefix(c.url, db.URL), got, c.want)
		}
		if err := n.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// A node started as `mefor run` starts it opens its pool's connections
// before Start returns (Options.OpenConnsAtStart), so that neither its first
// messages nor a burst of drainers later wait for a cold session to open;
// without the option it opens them on demand.
func TestNodeOpensItsConnectionsAtStart(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	sessions := func(node string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`,
			leader.ApplicationName(node)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	max := int(db.Pool.Config().MaxConns)
	cluster.StartNode(t, db, idleConfig(t), func(o *engine.Options) { o.NodeID, o.OpenConnsAtStart = "eager", true })
	if n := sessions("eager"); n < max {
		t.Fatalf("a node opening its connections at start has %d sessions when Start returns, want at least its pool's %d", n, max)
	}
	cluster.StartNode(t, db, idleConfig(t), func(o *engine.Options) { o.NodeID = "lazy" })
	if n := sessions("lazy"); n >= max {
		t.Fatalf("an idle node opening connections on demand has %d sessions, want fewer than %d", n, max)
	}
}

// commitLog records how many messages each intake commit of a node carried.
type commitLog struct {
	mu    sync.Mutex
	sizes []int
}

func (l *commitLog) add(messages int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sizes = append(l.sizes, messages)
}

// get returns the sizes recorded since the last reset, in commit order.
func (l *commitLog) get() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sizes)
}

func (l *commitLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sizes = nil
}

// twoChannelNode starts a node with channels ch0 and ch1, both delivering to
// one partner, and returns their listen addresses and the log of the node's
// intake commits.
func twoChannelNode(t *testing.T, db *testcontainers.DB) (*engine.Node, [2]string, *commitLog) {
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
	n := cluster.StartNode(t, db, cfg, nil)
	commits := &commitLog{}
	engine.SetCommitHook(n.Intake(), commits.add)
	return n, addrs, commits
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
	n, addrs, commits := twoChannelNode(t, db)
	// Warm up: both lanes get their drainers.
	for i, a := range addrs {
		if r := <-sendAsync(t, a, adt(fmt.Sprintf("W%d", i), "P0")); r.err != nil || r.ack.Code != hl7.AckAccept {
			t.Fatalf("warm-up message: %+v", r)
		}
	}
	commits.reset()
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
		return len(commits.get()) == 1
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
	// A alone (nobody else was there), then B and X together; the batch
	// refused for X is then stored message by message.
	if got := commits.get(); !slices.Equal(got, []int{1, 2, 1, 1}) {
		t.Errorf("intake commits carried %v messages, want [1 2 1 1]", got)
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
	_, addrs, commits := twoChannelNode(t, db)
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
	if got := len(commits.get()); got >= conns*perConn {
		t.Errorf("%d messages took %d intake commits; want them batched", conns*perConn, got)
	}

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

// refusals counts the intake batches the database refused for a lane
// without a live drainer: each is a wasted round trip, and an ERROR line in
// the server's log.
type refusals struct {
	tripCounter
	n atomic.Int64
}

func (r *refusals) TraceBatchEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if errors.Is(data.Err, jobs.ErrNoLiveDrainer) {
		r.n.Add(1)
	}
}

// A quiet interface, one message every few drainer lingers, finds its lane's
// drainer gone each time. Its messages are stored in the transaction that
// activates a drainer, without first being refused by the one round trip
// that needs a live one; they arrive, in order.
func TestQuietInterfaceIsNotRefusedFirst(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	tracer := &refusals{}
	const linger = 100 * time.Millisecond
	listen, p := startTracedNode(t, db, tracer, linger)

	var want []string
	for i := range 5 {
		id := fmt.Sprintf("Q%d", i)
		want = append(want, id)
		send(t, listen, adt(id, "P1"))
		fixtures.Eventually(t, 10*time.Second, id+" delivered", func() bool { return slices.Contains(p.acceptedIDs(), id) })
		fixtures.Eventually(t, 10*time.Second, "the lanes' drainers done", func() bool { return liveDrainers(t, db) == 0 })
	}
	if got := firstDeliveries(p.acceptedIDs()); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if n := tracer.n.Load(); n != 0 {
		t.Errorf("%d of 5 messages to a lane without a drainer were refused first", n)
	}
}

// Without encryption keys intake stores no patient identifier at all: the
// patient search column holds only a keyed blind index, never the MRN in
// clear (without keys only a mark that the message names a patient, for
// keys rotate to index later), so nothing is found by patient.
func TestIntakeStoresNoClearPatientWithoutKeys(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen := fixtures.FreeAddr(t)
	cluster.StartNode(t, db, testConfig(t, listen, `
  lab:
    type: mllp
    mllp: {address: "`+p.addr+`"}
`), nil)
	send(t, listen, adt("S000", "P777"), adt("S001", "P888"), adt("S002", "P777"))

	var n, other int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE patient_key IS DISTINCT FROM $1) FROM mefor_message`, pipeline.UnindexedPatient).Scan(&n, &other); err != nil {
		t.Fatal(err)
	}
	if n != 3 || other != 0 {
		t.Fatalf("%d messages, %d with a patient_key other than %q; want 3 and none", n, other, pipeline.UnindexedPatient)
	}
	got, err := search.ListMessages(context.Background(), db.Pool, search.MessageFilter{Patient: "P777"})
	if err != nil || len(got) != 0 {
		t.Fatalf("messages of patient P777 without keys = %+v, %v; want none", got, err)
	}
}
