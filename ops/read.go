package ops

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/leader"
)

// ListMessages returns messages newest first (metadata only).
func ListMessages(ctx context.Context, pool *pgxpool.Pool, f store.MessageFilter) ([]store.MessageSummary, error) {
	return store.ListMessages(ctx, pool, f)
}

// MessageView is everything `messages show` presents about one message.
type MessageView struct {
	Message store.MessageDetail `json:"message"`
	Work    []store.WorkInfo    `json:"work"`
	Replies []store.Reply       `json:"replies"`
	Events  []store.Event       `json:"events"`
	// Origin is the file the message was read from, the message it is the
	// reply to, and the replies routed back in from its deliveries.
	Origin store.Origin `json:"origin"`
}

// ShowMessage reads one message with its stage rows, partner replies,
// timeline and origin (file, parent, replies routed in), all from one
// snapshot. Bodies (the message's and the replies')
// are read only when withBody is set. An unknown id wraps store.ErrNotFound.
func ShowMessage(ctx context.Context, pool *pgxpool.Pool, id int64, withBody bool) (*MessageView, error) {
	var v MessageView
	err := readTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if v.Message, err = store.GetMessage(ctx, tx, id, withBody); err != nil {
			return err
		}
		if v.Work, err = store.MessageWork(ctx, tx, id); err != nil {
			return err
		}
		if v.Replies, err = store.MessageReplies(ctx, tx, id, withBody); err != nil {
			return err
		}
		if v.Events, err = store.MessageEvents(ctx, tx, id); err != nil {
			return err
		}
		v.Origin, err = store.MessageOrigin(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// ListDead returns dead rows of every stage, most recently dead first.
func ListDead(ctx context.Context, pool *pgxpool.Pool, f store.DeadFilter) ([]store.DeadRow, error) {
	return store.ListDead(ctx, pool, f)
}

// Status returns the per-channel and per-destination counts from one
// snapshot.
func Status(ctx context.Context, pool *pgxpool.Pool) (*store.Status, error) {
	var st *store.Status
	err := readTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		st, err = store.ReadStatus(ctx, tx)
		if err != nil {
			return err
		}
		st.Config, err = leader.ReadConfigStatus(ctx, tx)
		if err != nil {
			return err
		}
		cl, err := leader.ReadClusterStatus(ctx, tx)
		st.Cluster = &cl
		if err != nil {
			return err
		}
		rs, err := store.ReadRetentionStatus(ctx, tx)
		st.Retention = &rs
		if err != nil {
			return err
		}
		st.Transport, err = store.ReadTransportStatus(ctx, tx)
		return err
	})
	return st, err
}
