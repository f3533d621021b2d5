package workers_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/maintenance"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// populate stores n messages received age ago, as the pipeline leaves them
// once delivered: an ingress and an outbound row (done), a delivered event
// and the partner's ACK. When pendingEvery > 0, every pendingEvery-th message
// instead still has its delivery pending (in flight). It writes with
// generate_series, so a million messages take seconds, not hours.
func populate(ctx context.Context, pool *pgxpool.Pool, n int, age time.Duration, pendingEvery int) error {
	const body = `'MSH|^~\&|LAB|HOSP|EHR|HOSP|20260101120000||ORU^R01|' || g || '|P|2.5' || repeat('|OBX|1|NM|GLU^Glucose||5.4|mmol/L', 12)`
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		WITH m AS (
			INSERT INTO mefor_message (channel, source, size, raw, status, received_at, control_id, message_type, trigger_event)
			SELECT 'adt', 'mllp', 500, convert_to(%s, 'UTF8'),
				CASE WHEN $3 > 0 AND g %% $3 = 0 THEN 'routed' ELSE 'processed' END,
				now() - $2::interval - (($1 - g) * interval '1 millisecond'), g::text, 'ORU', 'R01'
			FROM generate_series(1, $1) g
			RETURNING id, control_id::int AS g
		), w AS (
			INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status, payload, finished_at)
			SELECT id, s.stage, s.stage || CASE s.stage WHEN 'ingress' THEN ':adt' ELSE ':lab' END, 'adt',
				CASE s.stage WHEN 'outbound' THEN 'lab' END,
				CASE WHEN s.stage = 'outbound' AND $3 > 0 AND g %% $3 = 0 THEN 'pending' ELSE 'done' END,
				convert_to('MSH|payload|' || g, 'UTF8'), now() - $2::interval
			FROM m CROSS JOIN (VALUES ('ingress'), ('outbound')) s(stage)
			RETURNING id, message_id
		), e AS (
			INSERT INTO mefor_event (message_id, event, detail) SELECT id, 'delivered', 'lab answered AA' FROM m
		)
		INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
		SELECT w.message_id, w.id, 'lab', 1, 'ack', 'AA', convert_to('MSH|ack', 'UTF8') FROM w`, body),
		n, age, pendingEvery)
	if err != nil {
		return fmt.Errorf("populate %d messages: %w", n, err)
	}
	_, err = pool.Exec(ctx, "ANALYZE")
	return err
}

// retentionNode is a River client working only the retention job, as a node
// runs it.
func retentionNode(t testing.TB, pool *pgxpool.Pool, policy *config.Retention) *river.Client[pgx.Tx] {
	t.Helper()
	w := river.NewWorkers()
	river.AddWorker(w, &workers.RetentionWorker{
		Deps: &workers.Deps{Pool: pool, Logger: slog.New(slog.DiscardHandler)}, NodeID: "node-a",
		Policy: func() *config.Retention { return policy },
	})
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{jobs.QueueMaintenance: {MaxWorkers: 2}},
		Workers:           w,
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		stop, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = c.Stop(stop)
	})
	return c
}

// runRetention inserts a retention job and returns its audit row once the
// job finished.
func runRetention(t testing.TB, pool *pgxpool.Pool, c *river.Client[pgx.Tx], timeout time.Duration) maintenance.MaintenanceRun {
	t.Helper()
	ctx := context.Background()
	before, err := maintenance.LastRunID(ctx, pool, workers.MaintenanceRetention)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Insert(ctx, jobs.RetentionArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		runs, err := maintenance.RunsAfter(ctx, pool, workers.MaintenanceRetention, before)
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) > 0 {
			return runs[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("retention run not audited within %s", timeout)
	return maintenance.MaintenanceRun{}
}

// sendUntil stores ADT messages through in from four senders at once until
// stop closes, and returns when every sender has stopped. Each Receive's
// result, with how long it took, goes to stored; a sender stops early when
// stored returns false.
func sendUntil(ctx context.Context, in *engine.Intake, stop <-chan struct{}, stored func(r engine.Received, took time.Duration, err error) bool) {
	var wg sync.WaitGroup
	for s := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				raw := fmt.Appendf(nil, "MSH|^~\\&|ADT|HOSP|EHR|HOSP|20260101120000||ADT^A01|S%dN%d|P|2.5\rPID|1||%d\r", s, i, i)
				t0 := time.Now()
				r, err := in.Receive(ctx, "adt", "mllp", "127.0.0.1:1", raw)
				if !stored(r, time.Since(t0), err) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// Retention over tens of thousands of old messages runs in short batches
// while intake keeps storing (and so acknowledging) new messages: every
// message of the concurrent traffic is stored and keeps its body, the old
// messages still in flight keep theirs, and the audited counts match what
// was purged.
func TestRetentionUnderConcurrentIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	const old, pendingEvery = 20000, 100
	if err := populate(ctx, db.Pool, old, 40*24*time.Hour, pendingEvery); err != nil {
		t.Fatal(err)
	}
	client := retentionNode(t, db.Pool, &config.Retention{KeepBodies: 30 * 24 * time.Hour, KeepDead: 30 * 24 * time.Hour, BatchSize: 1000})
	in := &engine.Intake{Pool: db.Pool, Inserter: fixtures.Inserter(t, db), Logger: slog.New(slog.DiscardHandler)}

	// Intake traffic for as long as retention runs.
	stop := make(chan struct{})
	var acked sync.Map // message id -> time the ACK could go out
	var failures atomic.Int64
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		sendUntil(ctx, in, stop, func(r engine.Received, _ time.Duration, err error) bool {
			if err != nil {
				if failures.Add(1) == 1 {
					t.Errorf("intake failed: %v", err)
				}
				return true
			}
			acked.Store(r.MessageID, time.Now())
			return true
		})
	}()
	run := runRetention(t, db.Pool, client, 5*time.Minute)
	close(stop)
	<-sent

	if run.Outcome != maintenance.RunOK {
		t.Fatalf("retention run %s: %s", run.Outcome, run.Error)
	}
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d messages of the concurrent traffic could not be stored (no ACK)", n)
	}
	var ids []int64
	during := 0
	acked.Range(func(k, v any) bool {
		ids = append(ids, k.(int64))
		if at := v.(time.Time); at.After(run.StartedAt) && at.Before(run.FinishedAt) {
			during++
		}
		return true
	})
	t.Logf("retention of %d messages took %s in %v batches; %d messages stored meanwhile",
		old, run.FinishedAt.Sub(run.StartedAt), run.Detail["batches"], during)
	// Intake was never shut out for the run's length: messages were
	// stored between its batches, not only before and after it.
	if during == 0 {
		t.Fatalf("no message was stored while retention ran (%s)", run.FinishedAt.Sub(run.StartedAt))
	}
	if n := fixtures.Count(t, db.Pool, `SELECT count(*) FROM mefor_message WHERE id = ANY($1) AND raw IS NOT NULL AND body_purged_at IS NULL`, ids); n != int64(len(ids)) {
		t.Fatalf("%d of %d concurrently received messages still have their body", n, len(ids))
	}

	inFlight := int64(old / pendingEvery)
	want := map[string]float64{"bodies_nulled": float64(old) - float64(inFlight), "dead_payloads_nulled": 0, "messages_deleted": 0}
	for k, v := range want {
		if run.Detail[k] != v {
			t.Errorf("audit %s = %v, want %v (detail %v)", k, run.Detail[k], v, run.Detail)
		}
	}
	if b, _ := run.Detail["batches"].(float64); b < 10 {
		t.Errorf("%v batches for %d messages in batches of 1000: the purge is not batched", run.Detail["batches"], old)
	}
	if n := fixtures.Count(t, db.Pool, `SELECT count(*) FROM mefor_message WHERE status = 'processed' AND raw IS NULL AND body_purged_at IS NOT NULL`); n != int64(old)-inFlight {
		t.Errorf("%d old processed messages purged, want %d", n, int64(old)-inFlight)
	}
	if n := fixtures.Count(t, db.Pool, `SELECT count(*) FROM mefor_message m WHERE status = 'routed' AND raw IS NOT NULL AND body_purged_at IS NULL
		AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.payload IS NULL)
		AND NOT EXISTS (SELECT 1 FROM mefor_response r WHERE r.message_id = m.id AND r.body IS NULL)
		AND NOT EXISTS (SELECT 1 FROM mefor_event e WHERE e.message_id = m.id AND e.detail IS NULL)`); n != inFlight {
		t.Errorf("%d of %d old in-flight messages kept all their content", n, inFlight)
	}
}

// A job the config does not schedule can still be run by hand; the registry
// lists reclaim and retention always (keep_errors applies without a
// retention block) and a sync per reference set, and the node's periodic
// jobs come from the same list.
func TestMaintenanceRegistry(t *testing.T) {
	cfg := adtToOut(t, `
maintenance:
  retention: {keep_bodies: 30d, schedule: "0 3 * * *"}
`, nil)
	list := workers.MaintenanceJobs(cfg)
	if len(list) != 3 || list[0].Name != "reclaim" || list[1].Name != "retention" || list[2].Name != "audit-anchor" {
		t.Fatalf("jobs = %+v, want reclaim, retention and audit-anchor", list)
	}
	if _, ok := list[2].Args.(jobs.AuditAnchorArgs); !ok || list[2].Schedule.String() != "15m0s" || !list[2].RunOnStart {
		t.Errorf("audit anchor job = %+v, want every 15m and at a leader's start", list[2])
	}
	if _, ok := list[1].Args.(jobs.RetentionArgs); !ok || list[1].Schedule.String() != "0 3 * * *" || !list[1].Audited {
		t.Errorf("retention job = %+v", list[1])
	}
	if !list[0].RunOnStart {
		t.Error("reclaim must run when a node becomes leader")
	}
	if got := len(workers.PeriodicJobs(list)); got != 3 {
		t.Errorf("%d periodic jobs, want 3", got)
	}
	if _, ok := workers.FindMaintenanceJob(cfg, "vacuum"); ok {
		t.Error("found a job that does not exist")
	}
	var _ rivertype.JobArgs = jobs.RetentionArgs{}

	list = workers.MaintenanceJobs(adtToOut(t, "", nil))
	if len(list) != 3 || list[1].Name != "retention" || list[1].Schedule.String() != "1h0m0s" {
		t.Fatalf("jobs without a retention block = %+v, want reclaim and an hourly retention", list)
	}
}

// A file without a retention block purges no content, yet its node's
// retention run deletes an unparseable message older than keep_errors'
// default and audits it.
func TestRetentionWithoutBlockDeletesOldErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	cfg := adtToOut(t, "", nil)
	insert := func(status string, age time.Duration) (id int64) {
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO mefor_message (channel, source, size, raw, status, received_at)
			VALUES ('adt', 'mllp', 4, 'JUNK', $1, now() - $2::interval) RETURNING id`, status, age).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	junk, recentJunk, old := insert("error", 31*24*time.Hour), insert("error", 29*24*time.Hour), insert("unrouted", 400*24*time.Hour)

	run := runRetention(t, db.Pool, retentionNode(t, db.Pool, cfg.Maintenance.Retention), time.Minute)
	if run.Outcome != maintenance.RunOK || run.Detail["errors_deleted"] != float64(1) || run.Detail["bodies_nulled"] != float64(0) {
		t.Fatalf("retention run: %s %s, detail %v; want ok, 1 error deleted, nothing purged", run.Outcome, run.Error, run.Detail)
	}
	if n := fixtures.Count(t, db.Pool, `SELECT count(*) FROM mefor_message WHERE id = $1`, junk); n != 0 {
		t.Fatal("the unparseable message received 31 days ago is still there")
	}
	if n := fixtures.Count(t, db.Pool, `SELECT count(*) FROM mefor_message WHERE id = ANY($1) AND raw IS NOT NULL`, []int64{recentJunk, old}); n != 2 {
		t.Fatalf("%d of the 29-day-old error and the 400-day-old unrouted message kept whole, want both", n)
	}
}
