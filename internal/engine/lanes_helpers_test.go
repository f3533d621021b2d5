package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, db *testcontainers.DB, sql string, args ...any) int {
	t.Helper()
	return int(fixtures.Count(t, db.Pool, sql, args...))
}

// queryStrings runs a query returning one text column.
func queryStrings(t *testing.T, db *testcontainers.DB, sql string, args ...any) []string {
	t.Helper()
	return queryRows(t, db, pgx.RowTo[string], sql, args...)
}

// queryRows runs a query and reads each row with scan.
func queryRows[T any](t *testing.T, db *testcontainers.DB, scan pgx.RowToFunc[T], sql string, args ...any) []T {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, scan)
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

// deliveredOnce counts the messages with exactly one delivered event.
func deliveredOnce(t *testing.T, db *testcontainers.DB) int {
	t.Helper()
	return queryInt(t, db, `
		SELECT count(*) FROM (SELECT message_id FROM mefor_event WHERE event = 'delivered'
		GROUP BY message_id HAVING count(*) = 1) x`)
}

// runningOutbound is the id of the outbound drainer job that is running.
func runningOutbound(t *testing.T, db *testcontainers.DB) int64 {
	t.Helper()
	var id int64
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT id FROM river_job WHERE kind = 'mefor_outbound' AND state = 'running'`).Scan(&id); err != nil {
		t.Fatalf("find the running outbound drainer: %v", err)
	}
	return id
}

// rescue leaves the drainer jobs that match where (with args) as River's
// rescuer and reclaim leave a job whose execution died: set (their state
// and when they are due), an error entry appended, and river:rescue_count
// bumped.
func rescue(t *testing.T, db *testcontainers.DB, set, where string, args ...any) {
	t.Helper()
	fixtures.Exec(t, db, `
		UPDATE river_job SET `+set+`,
			errors = array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', 'rescued', 'trace', '')),
			metadata = metadata || jsonb_build_object('river:rescue_count', coalesce((metadata->>'river:rescue_count')::int, 0) + 1)
		WHERE `+where, args...)
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
