package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// hang, as an answer of a ctlPartner, sends no ACK: the partner holds the
// message until the sender gives up and closes the connection.
const hang hl7.AckCode = ""

// receipt is one message as a ctlPartner received it.
type receipt struct {
	id     string // MSH-10
	remote string // the sender's address: one per connection
	raw    []byte
}

// ctlPartner is a fake downstream MLLP system whose answer to each message
// is decided by the test, and may block: answer is called outside the
// partner's lock with the control id and how many times that id has been
// received so far (1 on first receipt).
type ctlPartner struct {
	addr string
	srv  *mllp.Server

	mu       sync.Mutex
	received []receipt
	accepted []string
	seen     map[string]int
	answer   func(ctx context.Context, id string, n int) hl7.AckCode
}

// newCtlPartner listens on addr ("" for any free port). A nil answer
// accepts everything.
func newCtlPartner(t *testing.T, addr string, answer func(ctx context.Context, id string, n int) hl7.AckCode) *ctlPartner {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	p := &ctlPartner{seen: map[string]int{}, answer: answer}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("partner listen: %v", err)
	}
	p.addr = ln.Addr().String()
	p.srv = &mllp.Server{Handler: mllp.HandlerFunc(p.serve)}
	go p.srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.srv.Shutdown(ctx)
	})
	return p
}

func (p *ctlPartner) serve(ctx context.Context, raw []byte, conn mllp.ConnInfo) []byte {
	msg, err := hl7.Parse(raw)
	if err != nil {
		return hl7.NewACKForUnparsed(raw, hl7.AckReject, "unparseable", hl7.NewControlID(), time.Now())
	}
	id := msg.ControlID()
	remote := ""
	if conn.RemoteAddr != nil {
		remote = conn.RemoteAddr.String()
	}
	p.mu.Lock()
	p.received = append(p.received, receipt{id: id, remote: remote, raw: raw})
	p.seen[id]++
	n := p.seen[id]
	answer := p.answer
	p.mu.Unlock()

	code := hl7.AckAccept
	if answer != nil {
		code = answer(ctx, id, n)
	}
	if code == hang {
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
		}
		return nil
	}
	if code == hl7.AckAccept {
		p.mu.Lock()
		p.accepted = append(p.accepted, id)
		p.mu.Unlock()
	}
	return hl7.NewACK(msg, code, "test partner says "+string(code), hl7.NewControlID(), time.Now())
}

// setAnswer replaces the answer function for messages received from now on.
func (p *ctlPartner) setAnswer(answer func(ctx context.Context, id string, n int) hl7.AckCode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer = answer
}

func (p *ctlPartner) receivedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.received))
	for i, r := range p.received {
		out[i] = r.id
	}
	return out
}

func (p *ctlPartner) acceptedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.accepted...)
}

// connections returns how many distinct connections delivered messages.
func (p *ctlPartner) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range p.received {
		seen[r.remote] = true
	}
	return len(seen)
}

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, db *testcontainers.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// queryStrings runs a query returning one text column.
func queryStrings(t *testing.T, db *testcontainers.DB, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// commitOrder is the order in which the ingress transactions of a channel
// committed: seq is drawn under the lane's transaction lock, held until
// commit, so within a lane seq order is commit order. (Message ids are drawn
// before the lock and are not.)
func commitOrder(t *testing.T, db *testcontainers.DB, channel string) []string {
	t.Helper()
	return queryStrings(t, db, `
		SELECT m.control_id FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.stage = 'ingress' AND w.channel = $1 ORDER BY w.seq`, channel)
}

// drainerKinds are the River job kinds of the stage drainers.
var drainerKinds = []string{"mefor_ingress", "mefor_routed", "mefor_outbound"}

// liveJobStates are the states in which a drainer holds its lane.
const liveJobStates = `('available', 'pending', 'running', 'retryable', 'scheduled')`

// strandedLanes returns lanes that have pending rows but no live drainer:
// what "no stranded backlog" forbids at every instant. One statement, so
// one snapshot: rows and jobs are seen as of the same moment.
func strandedLanes(ctx context.Context, db *testcontainers.DB) ([]string, error) {
	rows, err := db.Pool.Query(ctx, `
		SELECT DISTINCT w.lane
		FROM mefor_work w
		LEFT JOIN mefor_lane l ON l.name = w.lane
		LEFT JOIN river_job j ON j.id = l.job_id
		WHERE w.status = 'pending'
		  AND (j.id IS NULL OR j.state NOT IN `+liveJobStates+`)
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// liveDrainers counts drainer jobs in a live state.
func liveDrainers(t *testing.T, db *testcontainers.DB) int {
	t.Helper()
	return queryInt(t, db, `SELECT count(*) FROM river_job WHERE kind = ANY($1) AND state IN `+liveJobStates, drainerKinds)
}

// messageStatus returns the status of the message with a control id.
func messageStatus(t *testing.T, db *testcontainers.DB, controlID string) string {
	t.Helper()
	s := queryStrings(t, db, `SELECT status FROM mefor_message WHERE control_id = $1`, controlID)
	if len(s) != 1 {
		t.Fatalf("message %s: %d rows", controlID, len(s))
	}
	return s[0]
}

// outboundRow is the outbound work row of a message.
func outboundRow(t *testing.T, db *testcontainers.DB, controlID string) (status string, attempts int, lastError string) {
	t.Helper()
	status, attempts, lastError, err := tryOutboundRow(db, controlID)
	if err != nil {
		t.Fatalf("outbound row of %s: %v", controlID, err)
	}
	return status, attempts, lastError
}

// tryOutboundRow is outboundRow for a row that may not exist yet.
func tryOutboundRow(db *testcontainers.DB, controlID string) (status string, attempts int, lastError string, err error) {
	err = db.Pool.QueryRow(context.Background(), `
		SELECT w.status, w.attempts, coalesce(w.last_error, '') FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE m.control_id = $1 AND w.stage = 'outbound'`, controlID).Scan(&status, &attempts, &lastError)
	return status, attempts, lastError, err
}

// countStatus counts messages with a status.
func countStatus(t *testing.T, db *testcontainers.DB, status string) int {
	t.Helper()
	return queryInt(t, db, `SELECT count(*) FROM mefor_message WHERE status = $1`, status)
}

// waitStartupReclaim waits for the reclaim run every node does at start.
// A test that sets a long ReclaimInterval to keep reclaim from serving lanes
// behind its back must let that first run pass before it starts.
func waitStartupReclaim(t *testing.T, db *testcontainers.DB) {
	t.Helper()
	fixtures.Eventually(t, 20*time.Second, "the start-up reclaim run", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM river_job WHERE kind = 'mefor_reclaim' AND state = 'completed'`) > 0
	})
}

// logWatch is a slog handler that counts records whose message contains a
// watched text, so a test can wait for something the node only logs. It
// passes every record on to next.
type logWatch struct {
	next  slog.Handler
	state *logWatchState
}

type logWatchState struct {
	mu      sync.Mutex
	matches []string
	seen    map[string]int
}

func newLogWatch(next slog.Handler, watch ...string) *logWatch {
	return &logWatch{next: next, state: &logWatchState{matches: watch, seen: map[string]int{}}}
}

func (h *logWatch) Enabled(context.Context, slog.Level) bool { return true }

func (h *logWatch) Handle(ctx context.Context, r slog.Record) error {
	s := h.state
	s.mu.Lock()
	for _, m := range s.matches {
		if strings.Contains(r.Message, m) {
			s.seen[m]++
		}
	}
	s.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &logWatch{next: h.next.WithAttrs(as), state: h.state}
}

func (h *logWatch) WithGroup(name string) slog.Handler {
	return &logWatch{next: h.next.WithGroup(name), state: h.state}
}

// count returns how many records contained text.
func (h *logWatch) count(text string) int {
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	return h.state.seen[text]
}

// sendOne sends one message on its own connection and returns the ACK, or
// the error when no ACK came.
func sendOne(addr string, msg []byte) (hl7.Ack, error) {
	c := &mllp.Client{Addr: addr, AckTimeout: 10 * time.Second}
	defer c.Close()
	raw, err := c.Send(context.Background(), msg)
	if err != nil {
		return hl7.Ack{}, err
	}
	ack, err := hl7.ParseACK(raw)
	if err != nil {
		return hl7.Ack{}, errors.Join(errors.New("reply is not an ACK"), err)
	}
	return ack, nil
}

// ours keeps the control ids of ids that start with prefix. Partners listen
// on port 0, and a test of another package may point a node at a port it
// closed for a partner that is down; should the kernel give that port to
// one of ours, its messages would arrive too. Tests look at their own.
func ours(ids []string, prefix string) []string {
	var out []string
	for _, id := range ids {
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	return out
}

// firstDeliveries keeps the first occurrence of each id, in order.
func firstDeliveries(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
