package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// Retention's statements (package retention walks the messages and decides
// the windows). Each runs in a transaction that took its messages'
// locks with LockIdleMessages first.

// LockIdleMessages locks, without waiting, the non-pending rows and the finalize
// locks of the candidate messages, and returns those it got all of, in id
// order. Rows first, then message locks: the pipeline's lock order, so
// whoever holds a row this skipped can go on without meeting this
// transaction. A message with a pending row is not returned.
func LockIdleMessages(ctx context.Context, tx pgx.Tx, cands []int64) ([]int64, error) {
	idle, err := dbpool.Column[int64](ctx, tx, "lock rows of idle messages", `
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
		return nil, err
	}
	if len(idle) == 0 {
		return nil, nil
	}
	// The finalize lock key is the id truncated to 32 bits, as finalizeKeys
	// computes it in Go; bigint::bit(32) keeps the low 32 bits the same way.
	return dbpool.Column[int64](ctx, tx, "lock idle messages", `
		SELECT id FROM unnest($1::bigint[]) WITH ORDINALITY AS c(id, n)
		WHERE pg_try_advisory_xact_lock($2, id::bit(32)::int4)
		ORDER BY n`, idle, finalizeLockClass)
}

// DeleteMessages deletes, with all their rows, the messages of ids received
// before cut that have no pending row, except those dead-lettered at or
// after spare (nil spares nothing). It returns how many it deleted.
func DeleteMessages(ctx context.Context, tx pgx.Tx, ids []int64, cut time.Time, spare *time.Time) (int64, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM mefor_message m
		WHERE id = ANY($1) AND received_at < $2
		  AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+PendingByID+`)
		  AND ($3::timestamptz IS NULL OR NOT EXISTS (
			SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+DeadByID+`
			  AND coalesce(w.finished_at, w.updated_at) >= $3))`,
		ids, cut, spare)
	if err != nil {
		return 0, fmt.Errorf("delete messages: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteErrorMessages deletes, with all their rows, the messages of ids
// whose status is error, that have no pending row, and that failed before
// cut: by their latest dead letter when they have dead rows, else by their
// receipt (a message that did not parse). It returns how many it deleted.
func DeleteErrorMessages(ctx context.Context, tx pgx.Tx, ids []int64, cut time.Time) (int64, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM mefor_message m
		WHERE id = ANY($1) AND status = '`+StatusError+`' AND received_at < $2
		  AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+PendingByID+`)
		  AND coalesce((SELECT max(coalesce(w.finished_at, w.updated_at)) FROM mefor_work w
				WHERE w.message_id = m.id AND w.status = `+DeadByID+`) < $2, true)`,
		ids, cut)
	if err != nil {
		return 0, fmt.Errorf("delete error messages: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PurgeBodies purges the content of the messages of ids that have no
// pending row and are due: by their latest dead letter before dead when
// they have dead rows, else by their receipt before bodies. It nulls the
// raw body and error, the rows' payloads and errors, the events' details
// and the replies' bodies, and stamps body_purged_at. Neither cutoff may be
// zero (a disabled window is one nothing is older than). It returns the
// messages purged and the dead rows among their rows it purged.
func PurgeBodies(ctx context.Context, tx pgx.Tx, ids []int64, bodies, dead time.Time) (purged, deadRows int64, err error) {
	err = tx.QueryRow(ctx, `
		WITH due AS (
			SELECT m.id FROM mefor_message m
			WHERE m.id = ANY($1) AND m.body_purged_at IS NULL
			  AND NOT EXISTS (SELECT 1 FROM mefor_work w WHERE w.message_id = m.id AND w.status = `+PendingByID+`)
			  -- A message with dead rows is due by its latest death, others by
			  -- their arrival: max is NULL only without dead rows (updated_at is
			  -- never NULL), and $3 is never NULL.
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
		ids, bodies, dead).Scan(&purged, &deadRows)
	if err != nil {
		return 0, 0, fmt.Errorf("purge message bodies: %w", err)
	}
	return purged, deadRows, nil
}
