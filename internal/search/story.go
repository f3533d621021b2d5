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

// Bodies are a message's stored content as mefor_read_body returns it:
// sealed values stay sealed. Payloads and replies are keyed by their row
// id.
type Bodies struct {
	Raw      []byte
	Replies  map[int64][]byte
	Payloads map[int64][]byte
}

// ReadBodies reads the body, partner replies and delivery payloads of a
// message through mefor_read_body, which appends the view-body audit row
// (recording osUser and host, and actor, the mefor user, when not empty)
// in the transaction of q: an operator holds
// no SELECT on payloads and replies. Call it last in the transaction, so
// the audit log's lock is held only until the commit.
func ReadBodies(ctx context.Context, q pipeline.DBTX, messageID int64, osUser, host, actor string) (Bodies, error) {
	b := Bodies{Replies: map[int64][]byte{}, Payloads: map[int64][]byte{}}
	rows, err := q.Query(ctx, `SELECT kind, row_id, body FROM mefor_read_body($1, $2, $3, $4)`, messageID, osUser, host, actor)
	if err != nil {
		return b, fmt.Errorf("read the bodies of message %d: %w", messageID, err)
	}
	var kind string
	var id int64
	var body []byte
	_, err = pgx.ForEachRow(rows, []any{&kind, &id, &body}, func() error {
		switch kind {
		case "message":
			b.Raw = body
		case "reply":
			b.Replies[id] = body
		case "outbound":
			b.Payloads[id] = body
		}
		body = nil
		return nil
	})
	if err != nil {
		return b, fmt.Errorf("read the bodies of message %d: %w", messageID, err)
	}
	return b, nil
}

// MessageOutbound is each delivery of work (a message's stage rows, in id
// order) with its payload from b.
func MessageOutbound(work []WorkInfo, b Bodies) []Outbound {
	var out []Outbound
	for _, w := range work {
		if w.Stage != "outbound" {
			continue
		}
		out = append(out, Outbound{WorkID: w.ID, Destination: w.Destination, Lane: w.Lane, Status: w.Status,
			Attempts: w.Attempts, Payload: b.Payloads[w.ID]})
	}
	return out
}

// MessagesByControlID returns up to limit messages whose MSH-10 is
// controlID, newest first.
func MessagesByControlID(ctx context.Context, q pipeline.DBTX, controlID string, limit int) ([]MessageSummary, error) {
	return ListMessages(ctx, q, MessageFilter{ControlID: controlID, Limit: limit})
}

// MessageView is everything `messages show` presents about one message.
type MessageView struct {
	Message MessageDetail `json:"message"`
	Work    []WorkInfo    `json:"work"`
	Replies []Reply       `json:"replies"`
	Events  []Event       `json:"events"`
	// Outbound is each delivery's payload as sent (after transforms),
	// read only with the bodies.
	Outbound []Outbound `json:"-"`
	// Origin is the file the message was read from, the message it is the
	// reply to, and the replies routed back in from its deliveries.
	Origin Origin `json:"origin"`
}
