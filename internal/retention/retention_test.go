package retention_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/retention"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// fixture is a test's own database with the messages retention walks.
type fixture struct{ *fixtures.DBTest }

func newFixture(t *testing.T) *fixture { return &fixture{fixtures.NewDBTest(t)} }

// message stores a message received age ago whose rows have the given
// statuses (ingress done, then one outbound row per status), with an event
// carrying a detail and a partner reply per outbound row. deadAge is how long
// ago its dead rows died.
func (f *fixture) message(age, deadAge time.Duration, statuses ...string) int64 {
	f.T.Helper()
	var id int64
	err := pgx.BeginFunc(f.Ctx, f.DB.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(f.Ctx, `
			INSERT INTO mefor_message (channel, source, size, raw, status, received_at, error)
			VALUES ('adt', 'test', 9, 'MSH|body', 'routed', now() - $1::interval, 'partner said PID-5 is DOE^JOHN')
			RETURNING id`, age).Scan(&id); err != nil {
			return err
		}
		if _, err := tx.Exec(f.Ctx, `
			INSERT INTO mefor_work (message_id, stage, lane, channel, status, finished_at, payload)
			VALUES ($1, 'ingress', 'ingress:adt', 'adt', 'done', now() - $2::interval, 'MSH|in')`, id, age); err != nil {
			return err
		}
		for _, s := range statuses {
			var wid int64
			if err := tx.QueryRow(f.Ctx, `
				INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status, payload, last_error, finished_at)
				VALUES ($1, 'outbound', 'outbound:lab', 'adt', 'lab', $2, 'MSH|out', 'AE: bad PID-5 DOE^JOHN',
					CASE $2 WHEN 'pending' THEN NULL WHEN 'dead' THEN now() - $3::interval ELSE now() - $4::interval END)
				RETURNING id`, id, s, deadAge, age).Scan(&wid); err != nil {
				return err
			}
			if _, err := tx.Exec(f.Ctx, `
				INSERT INTO mefor_response (message_id, work_id, destination, attempt, outcome, ack_code, body)
				VALUES ($1, $2, 'lab', 1, 'ack', 'AA', 'MSA|AA')`, id, wid); err != nil {
				return err
			}
		}
		_, err := tx.Exec(f.Ctx, `
			INSERT INTO mefor_event (message_id, event, detail) VALUES ($1, 'failed', 'AE from lab: DOE^JOHN')`, id)
		return err
	})
	if err != nil {
		f.T.Fatal(err)
	}
	return id
}

// content says which parts of a message still hold content.
type content struct {
	Exists, Raw, Purged, Payloads, Errors, Details, Replies bool
	DeadPayloads                                            int64
}

func (f *fixture) content(id int64) content {
	f.T.Helper()
	var c content
	if f.Int("SELECT count(*) FROM mefor_message WHERE id = $1", id) == 0 {
		return c
	}
	c.Exists = true
	c.Raw = f.Int("SELECT count(*) FROM mefor_message WHERE id = $1 AND raw IS NOT NULL", id) > 0
	c.Purged = f.Int("SELECT count(*) FROM mefor_message WHERE id = $1 AND body_purged_at IS NOT NULL", id) > 0
	c.Payloads = f.Int("SELECT count(*) FROM mefor_work WHERE message_id = $1 AND payload IS NOT NULL AND status <> 'dead'", id) > 0
	c.DeadPayloads = f.Int("SELECT count(*) FROM mefor_work WHERE message_id = $1 AND payload IS NOT NULL AND status = 'dead'", id)
	c.Errors = f.Int(`SELECT count(*) FROM mefor_work WHERE message_id = $1 AND last_error IS NOT NULL`, id)+
		f.Int(`SELECT count(*) FROM mefor_message WHERE id = $1 AND error IS NOT NULL`, id) > 0
	c.Details = f.Int("SELECT count(*) FROM mefor_event WHERE message_id = $1 AND detail IS NOT NULL", id) > 0
	c.Replies = f.Int("SELECT count(*) FROM mefor_response WHERE message_id = $1 AND body IS NOT NULL", id) > 0
	return c
}

var (
	kept   = content{Exists: true, Raw: true, Payloads: true, Errors: true, Details: true, Replies: true}
	purged = content{Exists: true, Purged: true}
)

const day = 24 * time.Hour

func (f *fixture) retain(p retention.Policy) retention.Counts {
	f.T.Helper()
	c, err := retention.Run(f.Ctx, f.DB.Pool, p, nil)
	if err != nil {
		f.T.Fatal(err)
	}
	return c
}

// Past keep_bodies the content of finished messages goes and their metadata
// stays; a message with a pending row is never touched however old; dead
// letters keep their content for keep_dead after they died; past
// delete_after idle messages are deleted outright.
func TestRetentionWindows(t *testing.T) {
	f := newFixture(t)
	// Oldest first, as ids are drawn.
	ancient := f.message(402*day, 0, "done")
	ancientDead := f.message(401*day, 399*day, "dead")
	oldPending := f.message(400*day, 0, "done", "pending")
	deadLongAgo := f.message(100*day, 95*day, "dead", "dead")
	old := f.message(40*day, 0, "done", "cancelled")
	deadRecently := f.message(40*day, 10*day, "done", "dead")
	unrouted := f.message(40*day, 0) // only its ingress row
	young := f.message(5*day, 0, "done")

	got := f.retain(retention.Policy{KeepBodies: 30 * day, KeepDead: 90 * day, DeleteAfter: 365 * day, Batch: 3})

	want := retention.Counts{BodiesNulled: 3, DeadPayloadsNulled: 2, MessagesDeleted: 2}
	if got.BodiesNulled != want.BodiesNulled || got.DeadPayloadsNulled != want.DeadPayloadsNulled ||
		got.MessagesDeleted != want.MessagesDeleted {
		t.Errorf("counts = %+v, want %+v", got, want)
	}
	// Deletion looks at the 3 messages past delete_after (one batch), the
	// body purge at the 6 others with a body (two).
	if got.Batches != 3 {
		t.Errorf("%d batches of at most 3 messages, want 3: the purge is not batched", got.Batches)
	}
	for _, c := range []struct {
		name string
		id   int64
		want content
	}{
		{"finished, past keep_bodies", old, purged},
		{"unrouted, past keep_bodies", unrouted, purged},
		{"dead past keep_dead", deadLongAgo, purged},
		{"young", young, kept},
		{"pending row, past delete_after", oldPending, kept},
		{"dead within keep_dead", deadRecently, func() content { k := kept; k.DeadPayloads = 1; return k }()},
		{"past delete_after", ancient, content{}},
		{"dead, past delete_after", ancientDead, content{}},
	} {
		if got := f.content(c.id); got != c.want {
			t.Errorf("%s: content %+v, want %+v", c.name, got, c.want)
		}
	}
	// Metadata survives the purge: the message is still listed with its
	// status and its rows, events and replies.
	if n := f.Int("SELECT count(*) FROM mefor_work WHERE message_id = $1", old); n != 3 {
		t.Errorf("purged message has %d rows, want its 3 rows kept", n)
	}
	if n := f.Int("SELECT count(*) FROM mefor_response WHERE message_id = $1 AND ack_code = 'AA'", old); n != 2 {
		t.Errorf("purged message has %d replies with their ACK code, want 2", n)
	}
	if n := f.Int("SELECT count(*) FROM mefor_work WHERE message_id = $1 AND status = 'pending' AND payload IS NOT NULL", oldPending); n != 1 {
		t.Errorf("pending row of an old message lost its payload")
	}

	// A second run finds nothing left to do.
	again := f.retain(retention.Policy{KeepBodies: 30 * day, KeepDead: 90 * day, DeleteAfter: 365 * day, Batch: 3})
	if again.BodiesNulled != 0 || again.DeadPayloadsNulled != 0 || again.MessagesDeleted != 0 {
		t.Errorf("second run did %+v, want nothing", again)
	}

	at, ok, err := retention.OldestRetainedBody(f.Ctx, f.DB.Pool)
	if err != nil || !ok {
		t.Fatalf("oldest retained body: %v %v", ok, err)
	}
	if age := time.Since(at); age < 399*day || age > 401*day {
		t.Errorf("oldest retained body is %s old, want the pending 400-day-old message", age)
	}
}

// A message whose rows or finalize lock someone holds (a replay, a
// finalizer) is skipped without waiting, and purged by the next run.
func TestRetentionSkipsBusyMessagesWithoutWaiting(t *testing.T) {
	f := newFixture(t)
	rowHeld := f.message(40*day, 40*day, "dead")
	lockHeld := f.message(40*day, 0, "done")
	idle := f.message(40*day, 0, "done")

	tx, err := f.DB.Pool.Begin(f.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.Ctx)
	if _, err := tx.Exec(f.Ctx, "SELECT id FROM mefor_work WHERE message_id = $1 AND status = 'dead' FOR UPDATE", rowHeld); err != nil {
		t.Fatal(err)
	}
	// The finalize lock, as the pipeline and replay take it.
	if _, err := tx.Exec(f.Ctx, "SELECT pg_advisory_xact_lock($1, $2)", int32(0x6d6d), int32(lockHeld)); err != nil {
		t.Fatal(err)
	}

	// Returns while the other transaction still holds its locks: it did
	// not wait (a wait would end in the batch's lock timeout, an error).
	got := f.retain(retention.Policy{KeepBodies: 30 * day, KeepDead: 30 * day, Batch: 100})
	if got.BodiesNulled != 1 || got.Skipped != 2 {
		t.Errorf("counts = %+v, want the idle message purged and 2 skipped", got)
	}
	if f.content(idle) != purged || f.content(rowHeld).Purged || f.content(lockHeld).Purged {
		t.Errorf("idle purged %v, row-held purged %v, lock-held purged %v; want only the idle one",
			f.content(idle).Purged, f.content(rowHeld).Purged, f.content(lockHeld).Purged)
	}
	if err := tx.Rollback(f.Ctx); err != nil {
		t.Fatal(err)
	}
	got = f.retain(retention.Policy{KeepBodies: 30 * day, KeepDead: 30 * day, Batch: 100})
	if got.BodiesNulled != 2 {
		t.Errorf("next run purged %d, want the 2 skipped ones", got.BodiesNulled)
	}
}

// A replay that read the message before retention purged it must not
// re-queue rows whose content is gone: it waits on retention's locks and
// then refuses with ErrBodyPurged, so no empty body is ever delivered.
func TestReplayRacingRetentionRefuses(t *testing.T) {
	f := newFixture(t)
	msg := f.message(40*day, 40*day, "dead")

	// Retention's batch, paused after it took its locks and purged,
	// before it commits.
	rtx, err := f.DB.Pool.Begin(f.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback(f.Ctx)
	if _, err := rtx.Exec(f.Ctx, "SELECT id FROM mefor_work WHERE message_id = $1 FOR NO KEY UPDATE", msg); err != nil {
		t.Fatal(err)
	}
	if _, err := rtx.Exec(f.Ctx, "SELECT pg_advisory_xact_lock($1, $2)", int32(0x6d6d), int32(msg)); err != nil {
		t.Fatal(err)
	}
	if _, err := rtx.Exec(f.Ctx, "UPDATE mefor_message SET raw = NULL, body_purged_at = now() WHERE id = $1", msg); err != nil {
		t.Fatal(err)
	}
	if _, err := rtx.Exec(f.Ctx, "UPDATE mefor_work SET payload = NULL WHERE message_id = $1", msg); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(f.Ctx, f.DB.Pool, func(tx pgx.Tx) error {
			_, err := pipeline.ReplayMessage(f.Ctx, tx, pipeline.Audit{}, msg)
			return err
		})
	}()
	// The replay reads the message as not purged, then queues on the row
	// locks; wait until it is blocked there.
	deadline := time.Now().Add(10 * time.Second)
	for f.Int(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("replay never waited on retention's locks")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := rtx.Commit(f.Ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, pipeline.ErrBodyPurged) {
		t.Fatalf("replay after a concurrent purge: %v, want ErrBodyPurged", err)
	}
	if n := f.Int("SELECT count(*) FROM mefor_work WHERE message_id = $1 AND status = 'pending'", msg); n != 0 {
		t.Fatalf("%d rows with purged content re-queued", n)
	}
}

// delete_after counts from receipt, keep_dead from the last dead letter: a
// message received long ago that was dead-lettered recently (it retried for
// months, or was replayed and died again) stays, content and all, until its
// keep_dead window ends, so it can still be replayed.
func TestRetentionDeleteAfterSparesRecentDeadLetters(t *testing.T) {
	f := newFixture(t)
	recentDead := f.message(400*day, 10*day, "done", "dead")
	oldDead := f.message(400*day, 100*day, "dead")

	got := f.retain(retention.Policy{KeepBodies: 30 * day, KeepDead: 90 * day, DeleteAfter: 365 * day, Batch: 10})

	if c := f.content(recentDead); !c.Exists || !c.Raw || c.DeadPayloads != 1 {
		t.Errorf("message dead-lettered 10 days ago (keep_dead 90d) after delete_after: content %+v, want it kept whole", c)
	}
	if c := f.content(oldDead); c.Exists {
		t.Errorf("message dead-lettered 100 days ago (keep_dead 90d) past delete_after still exists: %+v", c)
	}
	if got.MessagesDeleted != 1 {
		t.Errorf("counts = %+v, want 1 message deleted", got)
	}
}

// Retention looks for pending and dead rows of each message it may purge or
// delete, by message. Statistics taken while nothing was pending or dead
// made those lookups walk the partial indexes of pending and dead rows
// instead: a batch of 500 messages compared each with every pending row,
// so a partner's backlog slowed retention in proportion to it
// (pipeline.PendingByID, DeadByID).
func TestRetentionIgnoresStatisticsOfNoPendingRows(t *testing.T) {
	f := newFixture(t)
	f.Exec(`ALTER TABLE mefor_work SET (autovacuum_enabled = false)`)
	f.Exec(`ALTER TABLE mefor_message SET (autovacuum_enabled = false)`)
	for _, age := range []string{"100 days", "10 days"} {
		f.Exec(`WITH m AS (
				INSERT INTO mefor_message (channel, source, size, raw, status, received_at)
				SELECT 'adt', 'test', 1, 'x', 'processed', now() - $1::interval FROM generate_series(1, 500)
				RETURNING id)
			INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status, finished_at)
			SELECT id, 'outbound', 'outbound:lab', 'adt', 'lab', 'done', now() - $1::interval FROM m`, age)
	}
	f.Exec(`ANALYZE mefor_work, mefor_message`)
	// Then a partner goes down: a recent message with many rows pending
	// and dead, which retention leaves alone.
	const backlog = 20000
	recent := f.message(time.Hour, time.Hour)
	f.Exec(`INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status)
		SELECT $1, 'outbound', 'outbound:down', 'adt', 'down', s
		FROM generate_series(1, $2::int), (VALUES ('pending'), ('dead')) AS v(s)`, recent, backlog)

	reads := func() (partial, byMessage int64) {
		t.Helper()
		if err := f.DB.Pool.QueryRow(f.Ctx, `
			SELECT coalesce(sum(s.idx_tup_read) FILTER (WHERE pg_get_expr(i.indpred, i.indrelid) LIKE '%pending%'
					OR pg_get_expr(i.indpred, i.indrelid) LIKE '%dead%'), 0)::bigint,
				coalesce(sum(s.idx_tup_read) FILTER (WHERE s.indexrelname = 'mefor_work_message'), 0)::bigint
			FROM pg_stat_user_indexes s JOIN pg_index i ON i.indexrelid = s.indexrelid
			WHERE s.relname = 'mefor_work'`).Scan(&partial, &byMessage); err != nil {
			t.Fatal(err)
		}
		return partial, byMessage
	}
	before, beforeByMessage := reads()
	c := f.retain(retention.Policy{KeepBodies: day, KeepDead: 7 * day, DeleteAfter: 30 * day, Batch: 100})
	if c.MessagesDeleted != 500 || c.BodiesNulled != 500 {
		t.Fatalf("retention deleted %d and purged %d messages, want 500 and 500", c.MessagesDeleted, c.BodiesNulled)
	}
	// The batches' sessions report their counts when they end; every
	// batch reads the work rows of its messages, so the counts are in once
	// those reads show.
	f.DB.Pool.Reset()
	var n int64
	for i := 0; ; i++ {
		partial, byMessage := reads()
		if n = partial - before; byMessage > beforeByMessage {
			break
		}
		if i == 50 {
			t.Fatal("the retention sessions' index reads never reached the statistics")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n > backlog/10 {
		t.Errorf("retention read %d entries of the pending and dead indexes in %d batches, with %d rows of another message pending and as many dead: it walked them at each batch", n, c.Batches, backlog)
	}
}

// unparseable stores a message that did not parse, received age ago: status
// error, its body and the parse error, no rows.
func (f *fixture) unparseable(age time.Duration) int64 {
	f.T.Helper()
	var id int64
	if err := f.DB.Pool.QueryRow(f.Ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status, received_at, error)
		VALUES ('adt', 'mllp', 4, 'JUNK', 'error', now() - $1::interval, 'not a valid HL7 v2 message')
		RETURNING id`, age).Scan(&id); err != nil {
		f.T.Fatal(err)
	}
	f.Exec(`INSERT INTO mefor_event (message_id, event, detail) VALUES ($1, 'received', 'mllp')`, id)
	return id
}

// keep_errors deletes `error` messages, rows and all, that long after they
// failed: a message that did not parse from its receipt, a dead-lettered one
// from its last dead letter. Messages not in error, and an error message
// with a row pending again (replayed), stay however old.
func TestRetentionKeepErrorsDeletesOldErrors(t *testing.T) {
	f := newFixture(t)
	oldJunk := f.unparseable(40 * day)
	deadLongAgo := f.message(100*day, 40*day, "dead")
	deadRecently := f.message(100*day, 10*day, "done", "dead")
	replayed := f.message(100*day, 40*day, "dead", "pending")
	processed := f.message(100*day, 0, "done")
	youngJunk := f.unparseable(10 * day)
	f.Exec(`UPDATE mefor_message SET status = 'error' WHERE id = ANY($1)`, []int64{deadLongAgo, deadRecently, replayed})

	got := f.retain(retention.Policy{KeepErrors: 30 * day, Batch: 10})

	for name, id := range map[string]int64{"unparseable 40 days ago": oldJunk, "dead-lettered 40 days ago": deadLongAgo} {
		if c := f.content(id); c.Exists {
			t.Errorf("%s (keep_errors 30d) still exists: %+v", name, c)
		}
		if n := f.Int(`SELECT count(*) FROM mefor_work WHERE message_id = $1`, id) +
			f.Int(`SELECT count(*) FROM mefor_event WHERE message_id = $1`, id); n != 0 {
			t.Errorf("%s: %d rows and events left", name, n)
		}
	}
	for name, id := range map[string]int64{
		"dead-lettered 10 days ago": deadRecently, "error with a pending row": replayed,
		"processed 100 days ago": processed, "unparseable 10 days ago": youngJunk,
	} {
		if c := f.content(id); !c.Exists || !c.Raw {
			t.Errorf("%s: %+v, want it kept whole", name, c)
		}
	}
	if got.ErrorsDeleted != 2 || got.MessagesDeleted != 0 || got.BodiesNulled != 0 {
		t.Errorf("counts = %+v, want 2 errors deleted and nothing else", got)
	}
}
