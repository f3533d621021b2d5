package search

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/pipeline"
)

// Origin is where a message came from beyond its source: the file it was
// read from, or the message whose delivery it is the reply to; and the
// replies its own deliveries brought back in.
type Origin struct {
	File *FileSource `json:"file,omitempty"`
	// Parent is the message this one is the reply to.
	Parent *LinkedMessage `json:"parent,omitempty"`
	// ReplyDepth counts the replies between this message and the one
	// received from outside (0).
	ReplyDepth int `json:"reply_depth"`
	// Replies are the messages stored from the replies to this message's
	// deliveries, oldest first.
	Replies []LinkedMessage `json:"reply_messages"`
}

// FileSource is the file a message was read from.
type FileSource struct {
	ID       int64     `json:"id"`
	Name     string    `json:"name"`
	Size     int64     `json:"size"`
	SHA256   string    `json:"sha256"`
	Messages int       `json:"messages"`
	Index    int       `json:"index"` // the message's place in the file, from 1
	StoredAt time.Time `json:"stored_at"`
	// Node is the node that took the file.
	Node string `json:"node,omitempty"`
}

// LinkedMessage is a message seen from a reply link: which one, and the
// delivery the reply answered.
type LinkedMessage struct {
	ID           int64     `json:"id"`
	Channel      string    `json:"channel"`
	MessageType  string    `json:"message_type,omitempty"`
	TriggerEvent string    `json:"trigger_event,omitempty"`
	ControlID    string    `json:"control_id,omitempty"`
	Status       string    `json:"status"`
	Error        string    `json:"error,omitempty"`
	ReceivedAt   time.Time `json:"received_at"`
	// Destination and Attempt name the delivery whose reply the child is.
	Destination string `json:"destination,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
}

// Type is the message type as HL7 writes it, e.g. "ACK^A01".
func (m LinkedMessage) Type() string {
	return MessageSummary{MessageType: m.MessageType, TriggerEvent: m.TriggerEvent}.Type()
}

// MessageOrigin reads a message's file, parent and replies. pipeline.ErrNotFound
// when there is no such message.
func MessageOrigin(ctx context.Context, q pipeline.DBTX, id int64) (Origin, error) {
	var o Origin
	var (
		fileID, parentID *int64
		index            *int
	)
	err := q.QueryRow(ctx, `SELECT source_file_id, source_file_index, parent_id, reply_depth FROM mefor_message WHERE id = $1`,
		id).Scan(&fileID, &index, &parentID, &o.ReplyDepth)
	if errors.Is(err, pgx.ErrNoRows) {
		return Origin{}, fmt.Errorf("message %d: %w", id, pipeline.ErrNotFound)
	}
	if err != nil {
		return Origin{}, fmt.Errorf("read origin of message %d: %w", id, err)
	}
	if fileID != nil {
		f := &FileSource{ID: *fileID}
		if index != nil {
			f.Index = *index
		}
		var sum []byte
		err := q.QueryRow(ctx, `SELECT name, size, sha256, messages, stored_at, coalesce(node_id, '') FROM mefor_intake_file WHERE id = $1`, *fileID).
			Scan(&f.Name, &f.Size, &sum, &f.Messages, &f.StoredAt, &f.Node)
		if err != nil {
			return Origin{}, fmt.Errorf("read source file of message %d: %w", id, err)
		}
		f.SHA256 = hex.EncodeToString(sum)
		o.File = f
	}
	links, err := linked(ctx, q, `WHERE m.id = (SELECT parent_id FROM mefor_message WHERE id = $1)`, id,
		`(SELECT parent_response_id FROM mefor_message WHERE id = $1)`)
	if err != nil {
		return Origin{}, fmt.Errorf("read parent of message %d: %w", id, err)
	}
	if len(links) > 0 {
		o.Parent = &links[0]
	}
	if o.Replies, err = linked(ctx, q, `WHERE m.parent_id = $1`, id, `m.parent_response_id`); err != nil {
		return Origin{}, fmt.Errorf("read replies of message %d: %w", id, err)
	}
	return o, nil
}

// linked reads messages matching where, with the delivery named by the
// response id expression resp.
func linked(ctx context.Context, q pipeline.DBTX, where string, id int64, resp string) ([]LinkedMessage, error) {
	texts, err := textColumn(ctx, q, "m.error")
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `
		SELECT m.id, m.channel, coalesce(m.message_type, ''), coalesce(m.trigger_event, ''), coalesce(m.control_id, ''),
			m.status, `+texts+`, m.received_at, coalesce(r.destination, ''), coalesce(r.attempt, 0)
		FROM mefor_message m
		LEFT JOIN mefor_response r ON r.id = `+resp+`
		`+where+`
		ORDER BY m.id`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (LinkedMessage, error) {
		var l LinkedMessage
		err := r.Scan(&l.ID, &l.Channel, &l.MessageType, &l.TriggerEvent, &l.ControlID, &l.Status, &l.Error,
			&l.ReceivedAt, &l.Destination, &l.Attempt)
		return l, err
	})
}
