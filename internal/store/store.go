// Package store holds the pipeline's SQL outside the drainers: intake, the
// finalizer, the operator reads and writes (replay, cancel, orphan
// dead-lettering), retention, reference snapshots and the destinations' lane
// layouts. The drainers' side (reading a lane, the fenced hand-offs and
// delivery records) is package drainer, which builds on the finalizer here.
// Every function that changes pipeline state takes the caller's
// transaction, so what it writes commits as one unit with the caller's
// other writes.
package store

import (
	"context"
	"errors"
	"fmt"

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

// PendingByID is what a statement that names its mefor_work rows by id (or
// by message) compares status with, as in "id = ANY($1) AND status = " +
// PendingByID: the value 'pending', which no plan can see when it is made.
//
// Written as a literal, status = 'pending' lets the planner answer the
// statement from a partial index of pending rows (mefor_work_lane_pending,
// mefor_work_pending_age), walking it whole and filtering on the id, in
// place of the primary key. It does so whenever the statistics say almost
// nothing is pending (taken on a quiet night, all work done), as walking
// an empty index costs nothing. A generic plan keeps that choice until the
// next ANALYZE, and a custom plan makes it anew. When a partner is then
// down, every such statement walks its whole backlog, where the primary key
// would reach its rows directly. A subquery's value is only known when the
// statement runs, so no plan can prove a partial index's predicate from it
// and the id's index is used. Lane reads
// keep the literal: the pending index is what serves them.
const PendingByID = "(SELECT '" + WorkPending + "')"

// DeadByID is PendingByID for dead rows, which mefor_work_dead holds: where
// nothing had died when the statistics were taken, each retention batch
// read every dead row of the table.
const DeadByID = "(SELECT '" + WorkDead + "')"

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
