package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/jobs"
)

// Inbound is a message as a listener (or `mefor enqueue`) received it.
type Inbound struct {
	Channel    string
	Source     string // "mllp", "file", "enqueue"
	RemoteAddr string
	Raw        []byte

	// Header fields, when the message parsed.
	ControlID       string
	MessageType     string
	TriggerEvent    string
	SendingApp      string
	SendingFacility string

	// ParseError, when set, is why the message could not be parsed (never
	// containing message content). The message is stored with status error
	// for inspection and gets no stage work.
	ParseError string
}

// Receive durably stores one inbound message in tx: the message row, its
// ingress work row, the received event and the activation of the ingress
// lane's drainer. The sender may be acknowledged only after tx commits.
func Receive(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, in Inbound) (int64, error) {
	status, errText := StatusReceived, ""
	if in.ParseError != "" {
		status, errText = StatusError, in.ParseError
	}
	var id int64
	err := tx.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, remote_addr, control_id, message_type, trigger_event,
			sending_app, sending_facility, size, raw, status, error)
		VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, ''),
			NULLIF($7, ''), NULLIF($8, ''), $9, $10, $11, NULLIF($12, ''))
		RETURNING id`,
		in.Channel, in.Source, in.RemoteAddr, in.ControlID, in.MessageType, in.TriggerEvent,
		in.SendingApp, in.SendingFacility, len(in.Raw), in.Raw, status, errText).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store message for channel %s: %w", in.Channel, err)
	}
	if err := AddEvent(ctx, tx, id, EventReceived, 0, "", in.Source); err != nil {
		return 0, err
	}
	if in.ParseError != "" {
		return id, AddEvent(ctx, tx, id, EventFailed, 0, "", in.ParseError)
	}

	lane := []string{jobs.IngressLane(in.Channel)}
	if err := jobs.LockLanes(ctx, tx, lane); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO mefor_work (message_id, stage, lane, channel) VALUES ($1, 'ingress', $2, $3)`,
		id, lane[0], in.Channel); err != nil {
		return 0, fmt.Errorf("queue message %d for routing: %w", id, err)
	}
	if err := jobs.Activate(ctx, tx, ins, lane); err != nil {
		return 0, err
	}
	return id, nil
}
