package search

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/pipeline"
)

// Outbound is one delivery of a message as it was (or will be) sent: the
// outbound row's payload, after the handler's transforms. Payload is nil
// once retention purged it. It never goes into logs or errors.
type Outbound struct {
	WorkID      int64  `json:"work_id"`
	Destination string `json:"destination"`
	Lane        string `json:"lane"`
	Status      string `json:"status"`
	Attempts    int    `json:"attempts"`
	Payload     []byte `json:"-"`
}

// MessageOutbound returns the outbound rows of a message with their
// payloads, in the order they were created.
func MessageOutbound(ctx context.Context, q pipeline.DBTX, messageID int64) ([]Outbound, error) {
	rows, err := q.Query(ctx, `
		SELECT id, coalesce(destination, ''), lane, status, attempts, payload
		FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'
		ORDER BY id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("read deliveries of message %d: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Outbound, error) {
		var o Outbound
		err := r.Scan(&o.WorkID, &o.Destination, &o.Lane, &o.Status, &o.Attempts, &o.Payload)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read deliveries of message %d: %w", messageID, err)
	}
	return out, nil
}

// MessagesByControlID returns up to limit messages whose MSH-10 is
// controlID, newest first.
func MessagesByControlID(ctx context.Context, q pipeline.DBTX, controlID string, limit int) ([]MessageSummary, error) {
	return ListMessages(ctx, q, MessageFilter{ControlID: controlID, Limit: limit})
}
