package pipeline

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// finalizeLockClass keys the per-message advisory lock the finalizer takes.
const finalizeLockClass int32 = 0x6d6d // "mm"

// FinalizeMany derives the disposition of messages from all their rows:
// nothing terminal while any row is pending; any dead row → error; else
// any outbound row → processed; else a routed message → filtered. It
// takes the messages' locks first, in id order, so two hand-offs finishing
// the last rows of one message at once cannot both see the other's row
// still pending, and two multi-message operations cannot deadlock. The
// batched hand-offs queue the same two statements (QueueFinalize).
func FinalizeMany(ctx context.Context, tx DBTX, messageIDs []int64) error {
	ids, keys := finalizeKeys(messageIDs)
	if _, err := tx.Exec(ctx, finalizeLockSQL, finalizeLockClass, keys); err != nil {
		return fmt.Errorf("lock messages for finalize: %w", err)
	}
	// A statement of its own, so its snapshot is taken after the locks.
	if _, err := tx.Exec(ctx, finalizeSQL, ids); err != nil {
		return fmt.Errorf("finalize messages: %w", err)
	}
	return nil
}

// QueueFinalize queues FinalizeMany's two statements onto a batch, for the
// drainers' hand-offs, which send a whole transaction's writes in one round
// trip. The batch runs inside the writer's transaction, after its row writes.
func QueueFinalize(b *pgx.Batch, messageIDs []int64) {
	ids, keys := finalizeKeys(messageIDs)
	b.Queue(finalizeLockSQL, finalizeLockClass, keys)
	b.Queue(finalizeSQL, ids)
}

// QueueDeadLetter queues the dead-lettering of pending rows (ids), each with
// its reason (never message content) and a dead event. Rows no longer pending
// are left alone. The caller finalizes the messages.
func QueueDeadLetter(b *pgx.Batch, ids []int64, reasons []string) {
	b.Queue(`
		WITH u AS (SELECT * FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS u(id, reason, n)),
		w AS (
			UPDATE mefor_work w SET status = 'dead', last_error = u.reason,
				updated_at = clock_timestamp(), finished_at = clock_timestamp()
			FROM u WHERE w.id = u.id AND w.status = `+PendingByID+`
			RETURNING w.id, w.message_id, w.destination, u.reason, u.n
		)
		INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
		SELECT message_id, 'dead', id, destination, reason FROM w ORDER BY n`, ids, reasons)
}

// finalizeKeys sorts and dedups message ids and folds each into the lock's
// int4 key space; a collision only makes two messages share a lock.
func finalizeKeys(messageIDs []int64) (ids, keys []int64) {
	ids = slices.Clone(messageIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	keys = make([]int64, len(ids))
	for i, id := range ids {
		keys[i] = int64(int32(id))
	}
	return ids, keys
}

// finalizeLockSQL takes the per-message locks in the order of $2.
const finalizeLockSQL = `SELECT pg_advisory_xact_lock($1, k::int4) FROM unnest($2::bigint[]) WITH ORDINALITY AS u(k, n) ORDER BY n`

// finalizeSQL derives the disposition of messages $1 from all their rows:
// nothing while any row is pending; any dead row → error; else any outbound
// row → processed; else a routed message → filtered.
const finalizeSQL = `
	WITH r AS (
		SELECT message_id,
			bool_or(status = 'pending')  AS any_pending,
			bool_or(status = 'dead')     AS any_dead,
			bool_or(stage = 'outbound')  AS any_outbound,
			min(last_error) FILTER (WHERE status = 'dead') AS dead_reason
		FROM mefor_work WHERE message_id = ANY($1::bigint[])
		GROUP BY message_id
	)
	UPDATE mefor_message m SET
		status = CASE
			WHEN r.any_dead THEN 'error'
			WHEN r.any_outbound THEN 'processed'
			ELSE 'filtered'
		END,
		error = CASE WHEN r.any_dead THEN 'dead-lettered: ' || coalesce(r.dead_reason, 'unknown reason') ELSE m.error END,
		updated_at = clock_timestamp()
	FROM r
	WHERE m.id = r.message_id
	  AND NOT r.any_pending
	  AND (r.any_dead OR r.any_outbound OR m.status = 'routed')`
