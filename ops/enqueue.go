package ops

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/jobs"
)

// Enqueuer stores messages as if a channel had received them, through the
// same intake a node's listeners use, so an operator's message takes the
// path of any other.
type Enqueuer struct {
	intake *engine.Intake
}

// NewEnqueuer returns an Enqueuer storing into pool and activating lanes
// through q (an insert-only client, NewQueue, is enough). kr seals what is
// stored; nil stores it in clear.
func NewEnqueuer(pool *pgxpool.Pool, q jobs.Inserter, kr *crypt.Keyring, logger *slog.Logger) *Enqueuer {
	return &Enqueuer{intake: &engine.Intake{Pool: pool, Inserter: q, Logger: logger, Keys: kr}}
}

// Enqueued is one stored message. A message that does not parse is stored
// too, with status error; ParseErr then says why.
type Enqueued struct {
	MessageID int64
	// ControlID is the message's MSH-10; empty when it did not parse.
	ControlID string
	ParseErr  error
}

// Enqueue parses and stores one message for channel. Only a database
// failure returns an error, and then the message is not stored.
//
// It is audited twice: a row saying it was requested (channel, size)
// commits before the message is stored, so no message enters unrecorded
// even if this process dies at once; a second row gives the outcome and
// the message id. Intake commits on its own (with other messages arriving
// at that moment), so it cannot share the audit row's transaction.
func (e *Enqueuer) Enqueue(ctx context.Context, channel string, raw []byte) (Enqueued, error) {
	target := map[string]any{"channel": channel, "bytes": len(raw)}
	if err := audit.AppendAlone(ctx, e.intake.Pool, audit.Entry{Action: audit.ActionEnqueue, Target: target,
		Outcome: audit.OutcomeRequested}); err != nil {
		return Enqueued{}, err
	}
	rec, err := e.intake.Receive(ctx, channel, "enqueue", "", raw)
	if err != nil {
		recordFailure(ctx, e.intake.Pool, audit.ActionEnqueue, target, err)
		return Enqueued{}, err
	}
	target["message_id"] = rec.MessageID
	if err := audit.AppendAlone(ctx, e.intake.Pool, audit.Entry{Action: audit.ActionEnqueue, Target: target}); err != nil {
		return Enqueued{}, fmt.Errorf("message %d stored, but its audit row was not: %w", rec.MessageID, err)
	}
	out := Enqueued{MessageID: rec.MessageID, ParseErr: rec.ParseErr}
	if rec.ParseErr == nil {
		out.ControlID = rec.Msg.ControlID()
	}
	return out, nil
}
