package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
