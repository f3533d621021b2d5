package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention purges message content past its retention window and keeps the
// metadata, in short batches so intake never waits long behind it.
//
// Two windows decide when a message's content goes:
//
//   - a message that was never dead-lettered: KeepBodies after receipt;
//   - a message with dead letters: KeepDead after its last dead letter, so
//     a dead letter stays replayable for its own window.
//
// Purging a message nulls its raw body, the payloads and errors of its stage
// rows, the details of its events and its partners' replies, and stamps
// body_purged_at; replay then refuses it (ErrBodyPurged). DeleteAfter, when
// set, deletes messages received before it outright, rows and all, except
// those still inside their KeepDead window.
//
// A message with a pending row is never touched, and neither is one whose
// rows or finalize lock are held by someone else at that moment (a replay, a
// finalizer): the next run gets it. Each batch locks its messages' rows with
// SKIP LOCKED and takes their finalize locks with try-locks, so it never
// waits on the pipeline and cannot deadlock with it, then re-checks "nothing
// pending" under those locks before it writes. Replay takes the same locks
// before it re-queues anything, so a message is either purged or replayed,
// never re-queued with its body gone.

// RetentionPolicy is what one retention run does. Zero durations disable
// their part.
type RetentionPolicy struct {
	KeepBodies  time.Duration
	KeepDead    time.Duration
	DeleteAfter time.Duration
	// Batch is how many messages one transaction looks at. Defaults to
	// 5000 when not positive.
	Batch int
}

// RetentionCounts is what a retention run did.
type RetentionCounts struct {
	// BodiesNulled counts messages whose content was purged.
	BodiesNulled int64 `json:"bodies_nulled"`
	// DeadPayloadsNulled counts dead-letter rows whose payload was purged
	// (a subset of the rows of the messages in BodiesNulled).
	DeadPayloadsNulled int64 `json:"dead_payloads_nulled"`
	// MessagesDeleted counts messages deleted with all their rows.
	MessagesDeleted int64 `json:"messages_deleted"`
	// Skipped counts candidates left for a later run because they had a
	// pending row, were locked by the pipeline or an operator, or (for
	// deletion) were dead-lettered within keep_dead.
	Skipped int64 `json:"skipped"`
	// Batches is how many transactions the run committed.
	Batches int `json:"batches"`
}

// retentionLockTimeout bounds how long a batch waits on a row lock it did
// not expect to meet (its SKIP LOCKED / try-lock steps avoid the expected
// ones); the batch then fails and the next run retries it.
const retentionLockTimeout = "5s"

// RunRetention applies p to the whole database, deletions first, in batches
// of p.Batch messages, each its own short transaction. The windows are
// measured from the database clock at the start of the run. progress, if not
// nil, is called after each batch with the counts so far. On error the counts
// say what the committed batches did.
func RunRetention(ctx context.Context, pool *pgxpool.Pool, p RetentionPolicy, progress func(RetentionCounts)) (RetentionCounts, error) {
	var c RetentionCounts
	if p.Batch <= 0 {
		p.Batch = 5000
	}
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return c, fmt.Errorf("retention: read database clock: %w", err)
	}
	cut := func(d time.Duration) time.Time {
		if d <= 0 {
			return time.Time{}
		}
		return now.Add(-d)
	}
	r := retention{pool: pool, batch: p.Batch, counts: &c, progress: progress}
	if del := cut(p.DeleteAfter); !del.IsZero() {
		if err := r.deletePass(ctx, del, cut(p.KeepDead)); err != nil {
			return c, err
		}
	}
	bodies, dead := cut(p.KeepBodies), cut(p.KeepDead)
	if !bodies.IsZero() || !dead.IsZero() {
		if err := r.bodyPass(ctx, bodies, dead); err != nil {
			return c, err
		}
	}
	return c, nil
}

type retention struct {
	pool     *pgxpool.Pool
	batch    int
	counts   *RetentionCounts
	progress func(RetentionCounts)
}

// lastIDBefore is the id of the last message received before t. Ids grow with
// receipt time, so the passes walk ids up to it and stop there instead of
// scanning messages too young to qualify.
func (r *retention) lastIDBefore(ctx context.Context, t time.Time) (int64, error) {
	var id int64
	err := r.pool.QueryRow(ctx, `
		SELECT id FROM mefor_message WHERE received_at < $1 ORDER BY received_at DESC LIMIT 1`, t).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("retention: find last message before %s: %w", t.Format(time.RFC3339), err)
	}
	// Ids are drawn before commit, so a message received just before t
	// may have a slightly larger id than one received just after; the
	// margin costs nothing as the passes also compare received_at.
	return id + 1000, nil
}

// deletePass deletes the idle messages received before cut, except those
// dead-lettered at or after deadCut: delete_after counts from receipt, and a
// dead letter keeps its keep_dead window whenever it died. A zero deadCut
// spares nothing.
func (r *retention) deletePass(ctx context.Context, cut, deadCut time.Time) error {
	var spare *time.Time
	if !deadCut.IsZero() {
		spare = &deadCut
	}
	upTo, err := r.lastIDBefore(ctx, cut)
	if err != nil || upTo == 0 {
		return err
	}
	return r.walk(ctx, upTo, `
		SELECT id FROM mefor_message
		WHERE id > $1 AND id <= $2 AND received_at < $4
		ORDER BY id LIMIT $3`, []any{cut},
		func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			tag, err := tx.Exec(ctx, `
				DELETE FROM mefor_message m
				WHERE id = ANY($1) AND received_at < $2
				  AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+PendingByID+`)
				  AND ($3::timestamptz IS NULL OR NOT EXISTS (
					SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+DeadByID+`
					  AND coalesce(w.finished_at, w.updated_at) >= $3))`,
				ids, cut, spare)
			if err != nil {
				return fmt.Errorf("delete messages: %w", err)
			}
			r.counts.MessagesDeleted += tag.RowsAffected()
			r.counts.Skipped += int64(len(ids)) - tag.RowsAffected()
			return nil
		})
}

func (r *retention) bodyPass(ctx context.Context, bodies, dead time.Time) error {
	latest := bodies
	if dead.After(latest) {
		latest = dead
	}
	upTo, err := r.lastIDBefore(ctx, latest)
	if err != nil || upTo == 0 {
		return err
	}
	// A zero cutoff disables its window: no timestamp is before it.
	return r.walk(ctx, upTo, `
		SELECT id FROM mefor_message
		WHERE id > $1 AND id <= $2 AND body_purged_at IS NULL
		ORDER BY id LIMIT $3`, nil,
		func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			var purged, deadRows int64
			err := tx.QueryRow(ctx, `
				WITH due AS (
					SELECT m.id FROM mefor_message m
					WHERE m.id = ANY($1) AND m.body_purged_at IS NULL
					  AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+PendingByID+`)
					  -- A message with dead rows is due by its latest death, others by
					  -- their arrival: max is NULL only without dead rows (updated_at is
					  -- never NULL), and $3 is never NULL (orNever).
					  AND coalesce((SELECT max(coalesce(w.finished_at, w.updated_at)) FROM mefor_work w
							WHERE w.message_id = m.id AND w.status = `+DeadByID+`) < $3,
						m.received_at < $2)
				), msg AS (
					UPDATE mefor_message m SET raw = NULL, error = NULL, body_purged_at = clock_timestamp()
					FROM due WHERE m.id = due.id
					RETURNING m.id
				), work AS (
					UPDATE mefor_work w SET payload = NULL, last_error = NULL
					FROM msg WHERE w.message_id = msg.id AND (w.payload IS NOT NULL OR w.last_error IS NOT NULL)
					RETURNING w.status
				), ev AS (
					UPDATE mefor_event e SET detail = NULL
					FROM msg WHERE e.message_id = msg.id AND e.detail IS NOT NULL
					RETURNING 1
				), resp AS (
					UPDATE mefor_response s SET body = NULL
					FROM msg WHERE s.message_id = msg.id AND s.body IS NOT NULL
					RETURNING 1
				)
				-- ev and resp run although nothing reads them: PostgreSQL
				-- always executes data-modifying WITH queries.
				SELECT (SELECT count(*) FROM msg), (SELECT count(*) FROM work WHERE status = 'dead')`,
				ids, orNever(bodies), orNever(dead)).Scan(&purged, &deadRows)
			if err != nil {
				return fmt.Errorf("purge message bodies: %w", err)
			}
			r.counts.BodiesNulled += purged
			r.counts.DeadPayloadsNulled += deadRows
			return nil
		})
}

// orNever turns a disabled (zero) cutoff into one nothing is older than.
func orNever(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0)
	}
	return t
}

// walk runs act over the messages pick selects, batch by batch in id order,
// each batch in its own transaction. pick gets $1 = cursor, $2 = upTo,
// $3 = batch size, then extra. act gets the ids of the batch this
// transaction locked: every non-pending row of each of them and its finalize
// lock. Candidates with a pending row or held by someone else are counted
// as skipped and left for the next run.
func (r *retention) walk(ctx context.Context, upTo int64, pick string, extra []any,
	act func(ctx context.Context, tx pgx.Tx, ids []int64) error) error {
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		var seen int
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+retentionLockTimeout+"'"); err != nil {
				return fmt.Errorf("set lock timeout: %w", err)
			}
			rows, err := tx.Query(ctx, pick, append([]any{after, upTo, r.batch}, extra...)...)
			if err != nil {
				return fmt.Errorf("pick messages: %w", err)
			}
			cands, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return fmt.Errorf("pick messages: %w", err)
			}
			if seen = len(cands); seen == 0 {
				return nil
			}
			after = cands[len(cands)-1]
			ids, err := lockIdle(ctx, tx, cands)
			if err != nil {
				return err
			}
			r.counts.Skipped += int64(len(cands) - len(ids))
			if len(ids) == 0 {
				return nil
			}
			return act(ctx, tx, ids)
		})
		if err != nil {
			return fmt.Errorf("retention batch after message %d: %w", after, err)
		}
		if seen == 0 {
			return nil
		}
		r.counts.Batches++
		if r.progress != nil {
			r.progress(*r.counts)
		}
	}
}

// lockIdle locks, without waiting, the non-pending rows and the finalize
// locks of the candidate messages, and returns those it got all of, in id
// order. Rows first, then message locks: the pipeline's lock order, so
// whoever holds a row this skipped can go on without meeting this
// transaction. A message with a pending row is not returned.
func lockIdle(ctx context.Context, tx pgx.Tx, cands []int64) ([]int64, error) {
	rows, err := tx.Query(ctx, `
		WITH locked AS MATERIALIZED (
			SELECT message_id FROM mefor_work
			WHERE message_id = ANY($1) AND status <> 'pending'
			ORDER BY id
			FOR NO KEY UPDATE SKIP LOCKED
		), got AS (
			SELECT message_id, count(*) AS n FROM locked GROUP BY message_id
		), have AS (
			SELECT message_id, count(*) FILTER (WHERE status <> 'pending') AS n,
			       bool_or(status = 'pending') AS pending
			FROM mefor_work WHERE message_id = ANY($1) GROUP BY message_id
		)
		SELECT c.id FROM unnest($1::bigint[]) AS c(id)
		LEFT JOIN got ON got.message_id = c.id
		LEFT JOIN have ON have.message_id = c.id
		WHERE NOT coalesce(have.pending, false) AND coalesce(got.n, 0) = coalesce(have.n, 0)
		ORDER BY c.id`, cands)
	if err != nil {
		return nil, fmt.Errorf("lock rows of idle messages: %w", err)
	}
	idle, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("lock rows of idle messages: %w", err)
	}
	if len(idle) == 0 {
		return nil, nil
	}
	// The finalize lock key is the id truncated to 32 bits, as lockMessages
	// computes it in Go; bigint::bit(32) keeps the low 32 bits the same way.
	rows, err = tx.Query(ctx, `
		SELECT id FROM unnest($1::bigint[]) WITH ORDINALITY AS c(id, n)
		WHERE pg_try_advisory_xact_lock($2, id::bit(32)::int4)
		ORDER BY n`, idle, finalizeLockClass)
	if err != nil {
		return nil, fmt.Errorf("lock idle messages: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("lock idle messages: %w", err)
	}
	return ids, nil
}

// OldestRetainedBody is when the oldest message whose body is still kept was
// received; ok is false when no body is kept.
func OldestRetainedBody(ctx context.Context, db DBTX) (at time.Time, ok bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT received_at FROM mefor_message WHERE body_purged_at IS NULL ORDER BY id LIMIT 1`).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read oldest retained body: %w", err)
	}
	return at, true, nil
}

// RetentionStatus is what `mefor status` shows of retention.
type RetentionStatus struct {
	// OldestBodyAt is when the oldest message whose body is still kept
	// was received; nil when no body is kept.
	OldestBodyAt *time.Time `json:"oldest_body_at,omitempty"`
	// OldestBodyAgeSeconds is its age by the database clock.
	OldestBodyAgeSeconds *float64 `json:"oldest_body_age_seconds,omitempty"`
}

// ReadRetentionStatus reads the oldest retained body and its age.
func ReadRetentionStatus(ctx context.Context, db DBTX) (RetentionStatus, error) {
	var rs RetentionStatus
	err := db.QueryRow(ctx, `
		SELECT received_at, extract(epoch FROM clock_timestamp() - received_at)::float8
		FROM mefor_message WHERE body_purged_at IS NULL ORDER BY id LIMIT 1`).Scan(&rs.OldestBodyAt, &rs.OldestBodyAgeSeconds)
	if errors.Is(err, pgx.ErrNoRows) {
		return rs, nil
	}
	if err != nil {
		return rs, fmt.Errorf("read oldest retained body: %w", err)
	}
	return rs, nil
}
