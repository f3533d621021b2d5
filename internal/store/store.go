// Package store holds the pipeline's SQL: intake, the stage hand-offs, the
// finalizer, and the operator reads and writes. Every function that changes
// pipeline state takes the caller's transaction, so a hand-off (consumed row,
// produced rows, events, lane activations) commits as one unit.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Message statuses (mefor_message.status).
const (
	StatusReceived  = "received"
	StatusRouted    = "routed"
	StatusUnrouted  = "unrouted"
	StatusFiltered  = "filtered"
	StatusProcessed = "processed"
	StatusError     = "error"
)

// Work row statuses (mefor_work.status).
const (
	WorkPending   = "pending"
	WorkDone      = "done"
	WorkDead      = "dead"
	WorkCancelled = "cancelled"
)

// Events of the message timeline (mefor_event.event).
const (
	EventReceived    = "received"
	EventRouted      = "routed"
	EventUnrouted    = "unrouted"
	EventTransformed = "transformed"
	EventFiltered    = "filtered"
	EventDelivered   = "delivered"
	EventFailed      = "failed"
	EventDead        = "dead"
	EventReplayed    = "replayed"
	EventCancelled   = "cancelled"
)

// finalizeLockClass keys the per-message advisory lock the finalizer takes.
const finalizeLockClass int32 = 0x6d6d // "mm"

// DBTX is what the read functions need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotFound is returned when a message or row does not exist.
var ErrNotFound = errors.New("not found")

// AddEvent appends to a message's timeline. detail must never hold message
// content: it is shown to operators and kept after bodies are purged.
func AddEvent(ctx context.Context, tx DBTX, messageID int64, event string, workID int64, destination, detail string) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
		VALUES ($1, $2, NULLIF($3, 0), NULLIF($4, ''), NULLIF($5, ''))`,
		messageID, event, workID, destination, detail)
	if err != nil {
		return fmt.Errorf("record %s event of message %d: %w", event, messageID, err)
	}
	return nil
}

// Finalize derives a message's disposition from all its rows, as the seed
// does: nothing terminal while any row is pending; any dead row → error; else
// any outbound row → processed; else a routed message → filtered. It takes the
// message's lock first so two hand-offs finishing the last two rows of one
// message at once cannot both see the other's row still pending.
func Finalize(ctx context.Context, tx DBTX, messageID int64) error {
	return FinalizeMany(ctx, tx, []int64{messageID})
}

// FinalizeMany finalizes several messages, locking them in id order so two
// multi-message operations cannot deadlock on each other.
func FinalizeMany(ctx context.Context, tx DBTX, messageIDs []int64) error {
	ids := slices.Clone(messageIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for _, id := range ids {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", finalizeLockClass, int32(id)); err != nil {
			return fmt.Errorf("lock message %d for finalize: %w", id, err)
		}
	}
	for _, id := range ids {
		if err := finalizeLocked(ctx, tx, id); err != nil {
			return err
		}
	}
	return nil
}

func finalizeLocked(ctx context.Context, tx DBTX, messageID int64) error {
	// One statement, evaluated on a snapshot taken after the lock.
	if _, err := tx.Exec(ctx, finalizeSQL, []int64{messageID}); err != nil {
		return fmt.Errorf("finalize message %d: %w", messageID, err)
	}
	return nil
}
