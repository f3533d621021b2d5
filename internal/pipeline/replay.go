package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operator writes: replay one message, replay dead letters, cancel
// pending deliveries, enqueue. Each is one call of a SECURITY DEFINER
// function of migration 024 (operators hold no INSERT or UPDATE on any
// pipeline table), in the caller's transaction. The function keeps the lock
// order every pipeline path uses: lane locks first (jobs.LaneLock's keys,
// computed in SQL), then the work rows, then the messages' finalize locks
// in id order. A row that re-enters its lane draws a fresh seq under the
// lane lock, so it goes to the back, and the function activates the lane
// in the same transaction (River's unique insert, written in SQL) so a
// drainer serves it. It appends the operation's audit row itself, last.

// ErrBodyPurged means retention removed the message's body, so there is
// nothing left to process or send again.
var ErrBodyPurged = errors.New("message body was purged by retention")

// Replay modes.
const (
	// ReplayRecover re-queues a message's dead and pending rows.
	ReplayRecover = "recover"
	// ReplayResend re-sends a message's delivered (done outbound) rows.
	ReplayResend = "resend"
)

// DeadFilter narrows ListDead, ReplayDeadBatch and CountDeadOutbound. Empty
// fields do not filter.
type DeadFilter struct {
	Channel     string
	Destination string
	Limit       int // ListDead only. Defaults to DefaultListLimit (50) when not positive.
}

// ReplayResult is what ReplayMessage did.
type ReplayResult struct {
	MessageID int64 `json:"message_id"`
	// Mode is ReplayRecover or ReplayResend; empty when there was nothing
	// to replay.
	Mode string `json:"mode,omitempty"`
	// Rows is how many rows were re-queued.
	Rows int `json:"rows"`
	// Status is the message's status afterwards.
	Status string `json:"status"`
}

// Audit is what an operator write function records of who acted, in the
// audit row it appends itself: the operating system user and host of the
// process (audit.Who) and the action's target, a JSON object (with the
// mefor user who acted, audit.DefinerTarget) the function adds its counts
// to.
type Audit struct {
	OSUser, Host, Target string
}

func (a Audit) target() string {
	if a.Target == "" {
		return "{}"
	}
	return a.Target
}

// SQLSTATEs the write functions raise for ErrNotFound and ErrBodyPurged.
const (
	codeNotFound   = "MF404"
	codeBodyPurged = "MF410"
)

// operatorError wraps err, the error of a write function, as ErrNotFound
// or ErrBodyPurged when it says so.
func operatorError(err error, what string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeNotFound:
			return fmt.Errorf("%s: %w", what, ErrNotFound)
		case codeBodyPurged:
			return fmt.Errorf("%s: %w", what, ErrBodyPurged)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// ReplayMessage re-queues one message, through mefor_replay:
//
//   - if it has dead or pending rows (any stage), those are re-queued with
//     attempts reset, error cleared and due now. Dead rows go to the back of
//     their lane; pending rows are still in their lane and keep their place,
//     so a replay never lets a message overtake the ones queued behind it.
//   - otherwise its delivered (done outbound) rows are re-sent, each at the
//     back of its lane. Done ingress and routed rows are history of stages
//     already handed on: they are never re-run.
//
// Cancelled rows are never touched. When rows were re-queued the message goes
// back to received (an ingress row is pending again) or routed, its error is
// cleared and a replayed event is recorded; the lanes are activated, and a
// lane whose head was waiting out a backoff and is now due has its snoozed
// drainer woken. The replay audit row (a's target with the mode, rows and
// status) is appended last. ErrNotFound for an unknown id, ErrBodyPurged
// when retention removed the body.
func ReplayMessage(ctx context.Context, tx pgx.Tx, a Audit, messageID int64) (ReplayResult, error) {
	res := ReplayResult{MessageID: messageID}
	err := tx.QueryRow(ctx, `SELECT mode, n_rows, status FROM mefor_replay($1, $2, $3, $4)`,
		messageID, a.OSUser, a.Host, a.target()).Scan(&res.Mode, &res.Rows, &res.Status)
	if err != nil {
		return res, operatorError(err, fmt.Sprintf("replay message %d", messageID))
	}
	return res, nil
}

// MaxWorkID is the largest work row id so far: bulk operations stop there,
// so rows arriving while they run are not chased.
func MaxWorkID(ctx context.Context, q DBTX) (int64, error) {
	var id int64
	if err := q.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM mefor_work").Scan(&id); err != nil {
		return 0, fmt.Errorf("read last work row id: %w", err)
	}
	return id, nil
}

// CountDeadOutbound counts the dead outbound rows ReplayDeadBatch would
// re-queue, up to and including row id upTo.
func CountDeadOutbound(ctx context.Context, q DBTX, f DeadFilter, upTo int64) (int, error) {
	var n int
	err := q.QueryRow(ctx, `
		SELECT count(*) FROM mefor_work
		WHERE stage = 'outbound' AND status = 'dead' AND id <= $3
		  AND ($1 = '' OR channel = $1) AND ($2 = '' OR destination = $2)`,
		f.Channel, f.Destination, upTo).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead deliveries: %w", err)
	}
	return n, nil
}

// BatchResult is what one batch of a bulk operation did.
type BatchResult struct {
	// Seen is how many candidate rows the batch looked at; 0 means the
	// operation is complete.
	Seen int
	// Rows is how many rows it changed.
	Rows int
	// Skipped counts rows left alone because their body was purged.
	Skipped int
	// Messages is how many distinct messages it touched.
	Messages int
	// LastID is the cursor for the next batch.
	LastID int64
	// Lanes are the lanes it changed rows in.
	Lanes []string
	// Marked are the rows CancelBatch marked for their running drainer to
	// resolve instead of cancelling them.
	Marked []int64
}

// ReplayDeadBatch re-queues, through mefor_replay_dead, up to limit dead
// outbound rows matching f with after < id <= upTo, in id order, at the
// back of their lanes (outbound only, the dead-letter view's scope), and
// activates their lanes. Each affected message goes from error back to
// routed and gets a replayed event per row. Rows whose message body was
// purged are skipped: there is nothing to send. A batch that saw a row
// appends the replay-dead audit row (a's target with the counts).
func ReplayDeadBatch(ctx context.Context, tx pgx.Tx, a Audit, f DeadFilter, after, upTo int64, limit int) (BatchResult, error) {
	var res BatchResult
	err := tx.QueryRow(ctx, `
		SELECT seen, n_rows, skipped, messages, last_id, lanes
		FROM mefor_replay_dead($1, $2, $3, $4, $5, $6, $7, $8)`,
		f.Channel, f.Destination, after, upTo, limit, a.OSUser, a.Host, a.target()).
		Scan(&res.Seen, &res.Rows, &res.Skipped, &res.Messages, &res.LastID, &res.Lanes)
	if err != nil {
		return res, operatorError(err, "replay dead deliveries")
	}
	return res, nil
}
