package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
)

// Inbound is a message as a listener (or `mefor enqueue`) received it.
type Inbound struct {
	Channel    string
	Source     string // "mllp", "file", "enqueue"
	RemoteAddr string
	// SourceIdentity is the subject of the sender's verified client
	// certificate, when it connected with mutual TLS.
	SourceIdentity string
	Raw            []byte

	// Header fields, when the message parsed.
	ControlID       string
	MessageType     string
	TriggerEvent    string
	SendingApp      string
	SendingFacility string
	// PatientID is PID-3.1, the patient identifier; stored as
	// PatientKey(Keys, PatientID) for `messages list --patient`.
	PatientID string

	// Keys seals the body (and a parse error, which may quote it) and
	// blinds the patient id; nil stores them in clear (encryption off).
	Keys *crypt.Keyring

	// ParseError, when set, is why the message could not be parsed (never
	// containing message content). The message is stored with status error
	// for inspection and gets no stage work.
	ParseError string

	// LeaseOwner, when set, makes the store refuse the message unless this
	// node holds a live listener lease, checked in the same transaction: a
	// node that lost the lease (frozen, cut off) cannot store, and so never
	// acknowledges, anything once another node may be listening.
	LeaseOwner string
}

// Receive durably stores one inbound message in tx: the message row, its
// ingress work row, the received event and the activation of the ingress
// lane's drainer. The sender may be acknowledged only after tx commits.
//
// A parsed message costs one round trip: the ingress lane's lock first
// (seq is drawn under it), then the message, its received event and its
// ingress row in one statement, then the live-drainer check. Only a lane
// without a live drainer costs a second trip, to insert one.
func Receive(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, in Inbound) (int64, error) {
	if in.ParseError != "" {
		return receiveMalformed(ctx, tx, in)
	}
	lane := jobs.IngressLane(in.Channel)
	b := &pgx.Batch{}
	if in.LeaseOwner != "" {
		leader.QueueLeaseCheck(b, in.LeaseOwner)
	}
	jobs.QueueLocks(b, []string{lane})
	var id int64
	b.Queue(`
		WITH m AS (
			INSERT INTO mefor_message (channel, source, remote_addr, control_id, message_type, trigger_event,
				sending_app, sending_facility, size, raw, status, source_identity, patient_key)
			VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, ''),
				NULLIF($7, ''), NULLIF($8, ''), $9, $10, 'received', NULLIF($12, ''), NULLIF($13, ''))
			RETURNING id
		), e AS (
			INSERT INTO mefor_event (message_id, event, detail) SELECT id, 'received', $2 FROM m
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel)
		SELECT id, 'ingress', $11, $1 FROM m
		RETURNING message_id`,
		in.Channel, in.Source, in.RemoteAddr, in.ControlID, in.MessageType, in.TriggerEvent,
		in.SendingApp, in.SendingFacility, len(in.Raw), in.Keys.Seal(ColRaw, in.Raw), lane, in.SourceIdentity,
		patientKey(in.Keys, in.PatientID)).QueryRow(func(r pgx.Row) error {
		return r.Scan(&id)
	})
	act := jobs.QueueActivation(b, []string{lane})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("store message for channel %s: %w", in.Channel, err)
	}
	if err := act.Finish(ctx, tx, ins); err != nil {
		return 0, err
	}
	return id, nil
}

// patientKey is the stored form of a patient id; "" stays "" (NULL).
func patientKey(kr *crypt.Keyring, id string) string {
	if id == "" {
		return ""
	}
	return PatientKey(kr, id)
}

// receiveMalformed stores a message that did not parse, with status error
// and its raw body for inspection, and no stage work.
func receiveMalformed(ctx context.Context, tx pgx.Tx, in Inbound) (int64, error) {
	if in.LeaseOwner != "" {
		b := &pgx.Batch{}
		leader.QueueLeaseCheck(b, in.LeaseOwner)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return 0, fmt.Errorf("store message for channel %s: %w", in.Channel, err)
		}
	}
	var id int64
	err := tx.QueryRow(ctx, `
		INSERT INTO mefor_message (channel, source, remote_addr, size, raw, status, error, source_identity)
		VALUES ($1, $2, NULLIF($3, ''), $4, $5, 'error', $6, NULLIF($7, ''))
		RETURNING id`,
		in.Channel, in.Source, in.RemoteAddr, len(in.Raw), in.Keys.Seal(ColRaw, in.Raw), in.Keys.SealString(ColError, in.ParseError),
		in.SourceIdentity).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store message for channel %s: %w", in.Channel, err)
	}
	if err := AddEvent(ctx, tx, id, EventReceived, 0, "", in.Source); err != nil {
		return 0, err
	}
	return id, AddEvent(ctx, tx, id, EventFailed, 0, "", in.Keys.SealString(ColError, in.ParseError))
}
