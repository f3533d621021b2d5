package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// env is one test's database and an insert-only River client, with helpers
// that drive messages through the real store hand-offs (no workers run, so
// every state is exactly what the test made it).
type env struct {
	t   *testing.T
	db  *testcontainers.DB
	q   *river.Client[pgx.Tx]
	ctx context.Context
	n   int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := testcontainers.NewDB(t)
	q, err := ops.NewQueue(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, db: db, q: q, ctx: context.Background()}
}

func (e *env) tx(fn func(tx pgx.Tx) error) {
	e.t.Helper()
	if err := pgx.BeginFunc(e.ctx, e.db.Pool, fn); err != nil {
		e.t.Fatal(err)
	}
}

// receive stores a message into channel as a listener would.
func (e *env) receive(channel string) int64 {
	e.t.Helper()
	e.n++
	raw := fmt.Sprintf("MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|C%03d|P|2.5\rPID|1||P%d\r", e.n, e.n)
	var id int64
	e.tx(func(tx pgx.Tx) error {
		var err error
		id, err = pipeline.Receive(e.ctx, tx, e.q, pipeline.Inbound{
			Channel: channel, Source: "test", Raw: []byte(raw),
			ControlID: fmt.Sprintf("C%03d", e.n), MessageType: "ADT", TriggerEvent: "A01",
		})
		return err
	})
	return id
}

// pendingRow returns the message's pending row in lane.
func (e *env) pendingRow(lane string, msg int64) pipeline.Row {
	e.t.Helper()
	return fixtures.PendingRow(e.t, e.db, lane, msg)
}

// route runs the ingress hand-off of a message: one route "r" to handler "h".
func (e *env) route(channel string, msg int64) {
	e.t.Helper()
	row := e.pendingRow(jobs.IngressLane(channel), msg)
	e.tx(func(tx pgx.Tx) error {
		return pipeline.RouteHandoff(e.ctx, tx, e.q, row, []pipeline.RoutedOut{{Route: "r", Handler: "h"}})
	})
}

// transform runs the routed hand-off of a message, producing one outbound
// row per lane (lane "outbound:lab" → destination "lab").
func (e *env) transform(channel string, msg int64, lanes ...string) {
	e.t.Helper()
	row := e.pendingRow(jobs.RoutedLane(channel), msg)
	var outs []pipeline.OutboundOut
	for _, l := range lanes {
		outs = append(outs, pipeline.OutboundOut{Destination: destOf(l), Lane: l, Payload: []byte("MSH|out")})
	}
	e.tx(func(tx pgx.Tx) error { return pipeline.TransformHandoff(e.ctx, tx, e.q, row, outs) })
}

// toOutbound receives a message and hands it on to outbound rows in lanes.
func (e *env) toOutbound(channel string, lanes ...string) int64 {
	e.t.Helper()
	id := e.receive(channel)
	e.route(channel, id)
	e.transform(channel, id, lanes...)
	return id
}

func destOf(lane string) string {
	d := lane[len("outbound:"):]
	for i := range len(d) {
		if d[i] == '#' {
			return d[:i]
		}
	}
	return d
}

func (e *env) deliver(lane string, msg int64) {
	e.t.Helper()
	row := e.pendingRow(lane, msg)
	e.tx(func(tx pgx.Tx) error {
		ok, err := pipeline.Delivered(e.ctx, tx, row, pipeline.Attempt{Outcome: "delivered", AckCode: "AA", Reply: []byte("MSH|ack")})
		if err == nil && !ok {
			err = fmt.Errorf("row %d was not pending", row.ID)
		}
		return err
	})
}

// fail records a failed attempt; dead dead-letters the row.
func (e *env) fail(lane string, msg int64, dead bool, backoff time.Duration) {
	e.t.Helper()
	row := e.pendingRow(lane, msg)
	e.tx(func(tx pgx.Tx) error {
		return pipeline.Failed(e.ctx, tx, row, pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: "partner rejected"}, backoff, dead)
	})
}

// blockHead fails msg, the head of lane, with an hour's backoff, and
// snoozes the lane's drainer for it, as a drainer does; it returns the
// drainer's job.
func (e *env) blockHead(lane string, msg int64) int64 {
	e.t.Helper()
	e.fail(lane, msg, false, time.Hour)
	return e.snoozeDrainer(lane, time.Hour)
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	fixtures.Exec(e.t, e.db, sql, args...)
}

func (e *env) queryInt(sql string, args ...any) int64 {
	e.t.Helper()
	return fixtures.Count(e.t, e.db.Pool, sql, args...)
}

// replay replays msg as `mefor replay` does, failing the test on an error.
func (e *env) replay(msg int64) pipeline.ReplayResult {
	e.t.Helper()
	res, err := ops.Replay(e.ctx, e.db.Pool, msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// cancel cancels what f selects as `mefor cancel` does, failing the test on
// an error.
func (e *env) cancel(f pipeline.CancelFilter, opt ops.BulkOptions) ops.BulkResult {
	e.t.Helper()
	res, err := ops.Cancel(e.ctx, e.db.Pool, f, opt)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func (e *env) queryStr(sql string, args ...any) string {
	e.t.Helper()
	var s string
	if err := e.db.Pool.QueryRow(e.ctx, sql, args...).Scan(&s); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// work is one row as a test inspects it.
type work struct {
	id        int64
	stage     string
	lane      string
	seq       int64
	status    string
	attempts  int
	lastError *string
	due       bool // next_attempt_at <= now
}

func (e *env) rows(msg int64) []work {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `
		SELECT id, stage, lane, seq, status, attempts, last_error, next_attempt_at <= clock_timestamp()
		FROM mefor_work WHERE message_id = $1 ORDER BY id`, msg)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (work, error) {
		var w work
		return w, r.Scan(&w.id, &w.stage, &w.lane, &w.seq, &w.status, &w.attempts, &w.lastError, &w.due)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// row returns the message's single row in a stage.
func (e *env) row(msg int64, stage string) work {
	e.t.Helper()
	var found []work
	for _, w := range e.rows(msg) {
		if w.stage == stage {
			found = append(found, w)
		}
	}
	if len(found) != 1 {
		e.t.Fatalf("message %d has %d %s rows, want 1: %+v", msg, len(found), stage, found)
	}
	return found[0]
}

func (e *env) status(msg int64) string {
	e.t.Helper()
	return e.queryStr("SELECT status FROM mefor_message WHERE id = $1", msg)
}

// drainerState is the River state of the lane's registered drainer job.
func (e *env) drainerState(lane string) (int64, string) {
	e.t.Helper()
	var id int64
	var state string
	err := e.db.Pool.QueryRow(e.ctx, `
		SELECT j.id, j.state::text FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = $1`, lane).Scan(&id, &state)
	if err != nil {
		e.t.Fatalf("drainer of lane %s: %v", lane, err)
	}
	return id, state
}

// finishDrainer marks the lane's drainer job completed, as a drainer that
// found its lane empty leaves it.
func (e *env) finishDrainer(lane string) int64 {
	e.t.Helper()
	id, _ := e.drainerState(lane)
	e.exec(`UPDATE river_job SET state = 'completed', finalized_at = now(), attempt = 1, attempted_at = now() WHERE id = $1`, id)
	return id
}

// snoozeDrainer leaves the lane's drainer job as a snooze does: scheduled
// for later.
func (e *env) snoozeDrainer(lane string, d time.Duration) int64 {
	e.t.Helper()
	id, _ := e.drainerState(lane)
	e.exec(`UPDATE river_job SET state = 'scheduled', scheduled_at = now() + make_interval(secs => $2), attempt = 1, attempted_at = now() WHERE id = $1`,
		id, d.Seconds())
	return id
}

// runDrainer marks the lane's drainer job running.
func (e *env) runDrainer(lane string) {
	e.t.Helper()
	id, _ := e.drainerState(lane)
	e.exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1`, id)
}

func (e *env) events(msg int64, event string) int64 {
	e.t.Helper()
	return e.queryInt("SELECT count(*) FROM mefor_event WHERE message_id = $1 AND event = $2", msg, event)
}

// rowIn returns the message's row in a lane.
func (e *env) rowIn(msg int64, lane string) work {
	e.t.Helper()
	for _, w := range e.rows(msg) {
		if w.lane == lane {
			return w
		}
	}
	e.t.Fatalf("message %d has no row in lane %s", msg, lane)
	return work{}
}
