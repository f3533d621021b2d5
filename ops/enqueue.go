package ops

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
)

// Enqueuer stores messages as if a channel had received them: parsed and
// sealed as intake parses and seals them, then stored through the database
// function mefor_enqueue (pipeline.Enqueue), which writes the rows intake
// writes and activates the ingress lane, so an operator's message takes the
// path of any other while the operator holds no INSERT on the pipeline.
type Enqueuer struct {
	pool *pgxpool.Pool
	keys *crypt.Keyring
}

// NewEnqueuer returns an Enqueuer storing into pool. kr seals what is
// stored; nil stores it in clear. The database function activates the
// lane: an operator may not write River's jobs.
func NewEnqueuer(pool *pgxpool.Pool, kr *crypt.Keyring) *Enqueuer {
	return &Enqueuer{pool: pool, keys: kr}
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
// even if this process dies at once; a second row, appended by
// mefor_enqueue in the transaction that stores it, gives the outcome and
// the message id.
func (e *Enqueuer) Enqueue(ctx context.Context, channel string, raw []byte) (Enqueued, error) {
	target := map[string]any{"channel": channel, "bytes": len(raw)}
	if err := audit.AppendAlone(ctx, e.pool, audit.Entry{Action: audit.ActionEnqueue, Target: target,
		Outcome: audit.OutcomeRequested}); err != nil {
		return Enqueued{}, err
	}
	in, msg, perr := pipeline.ParseInbound(channel, "enqueue", "", raw)
	in.Keys = e.keys
	var id int64
	err := auditedInDB(ctx, e.pool, audit.ActionEnqueue, target, func(tx pgx.Tx, a pipeline.Audit) error {
		var err error
		id, err = pipeline.Enqueue(ctx, tx, a, in)
		return err
	})
	if err != nil {
		return Enqueued{}, fmt.Errorf("enqueue a message for channel %s: %w", channel, err)
	}
	out := Enqueued{MessageID: id, ParseErr: perr}
	if perr == nil {
		out.ControlID = msg.ControlID()
	}
	return out, nil
}
