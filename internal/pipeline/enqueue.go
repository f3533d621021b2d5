package pipeline

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Enqueue stores in tx, through mefor_enqueue, one message an operator
// enqueued (`mefor enqueue`), as intake would have received it on
// in.Channel: the message, its received event and, when it parsed (no
// in.ParseError), its ingress row and the activation of the ingress lane's
// drainer; a message that did not parse is stored with status error and a
// failed event. It returns the message's id. The database draws the id,
// and with in.Keys set the body and parse error are sealed bound to it
// (mefor_enqueue_id, then the seal, then the insert, which refuses any
// other id): an operator cannot store content under an id it chose. The
// function appends the enqueue audit row (a's target with the message id)
// last.
func Enqueue(ctx context.Context, tx pgx.Tx, a Audit, in Inbound) (int64, error) {
	var id *int64 // NULL: the function draws it (nothing is sealed)
	at := MessageRow(0)
	if in.Keys.Enabled() {
		var drawn int64
		if err := tx.QueryRow(ctx, `SELECT mefor_enqueue_id()`).Scan(&drawn); err != nil {
			return 0, fmt.Errorf("draw the enqueued message's id: %w", err)
		}
		id, at = &drawn, MessageRow(drawn)
	}
	var parseErr *string
	patient := ""
	if in.ParseError != "" {
		e := in.Keys.SealString(ColError, at, in.ParseError)
		parseErr = &e
	} else {
		patient = patientKey(in.Keys, in.PatientID)
	}
	var stored int64
	err := tx.QueryRow(ctx, `SELECT mefor_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		id, in.Channel, ColumnText(in.ControlID), ColumnText(in.MessageType), ColumnText(in.TriggerEvent),
		ColumnText(in.SendingApp), ColumnText(in.SendingFacility), int32(len(in.Raw)), in.Keys.Seal(ColRaw, at, in.Raw),
		patient, parseErr, a.OSUser, a.Host, a.target()).Scan(&stored)
	if err != nil {
		return 0, fmt.Errorf("enqueue a message for channel %s: %w", in.Channel, err)
	}
	return stored, nil
}
