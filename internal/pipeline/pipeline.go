package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/dbpool"
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

// DBTX is what the read functions need: a pool, a connection or a transaction.
type DBTX = dbpool.DBTX

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
