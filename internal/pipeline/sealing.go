package pipeline

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/mefor/mefor/internal/crypt"
)

// The content columns, as sealed values name them in their authenticated
// data (see package crypt). Everything else mefor stores is metadata and
// stays clear: ids, channel, type, control id, status, times.
const (
	ColRaw       crypt.Column = "mefor_message.raw"
	ColPayload   crypt.Column = "mefor_work.payload"
	ColReply     crypt.Column = "mefor_response.body"
	ColState     crypt.Column = "mefor_state.value"
	ColReference crypt.Column = "mefor_reference_row.value"
	// ColError covers every error and event text (mefor_message.error,
	// mefor_work.last_error, mefor_event.detail) under one name: the
	// finalizer copies a row's error into its message's, and a failed
	// event quotes the row's error, in SQL. A script's error can quote the
	// message it failed on, so they are sealed like content.
	ColError crypt.Column = "mefor error text"
)

// MessageRow is what binds a message's content to its row (see
// crypt.Row): its body, its stage payloads, its partners' replies and every
// error and event text of it. Binding to the message, not the work row, lets
// what SQL copies within a message (the finalizer's error, a replay's new
// rows reading the same body) still open, while another message's value
// copied in does not.
func MessageRow(id int64) crypt.Row { return crypt.Row("message " + strconv.FormatInt(id, 10)) }

// patientPurpose keys the blind index of patient ids.
const patientPurpose = "patient"

// PatientKey is what the store keeps, and searches by, for a patient
// identifier (PID-3.1): mefor_message.patient_key, a keyed blind index (an
// HMAC of the id under the active key), so the clear id is never stored.
// Intake stores UnindexedPatient instead with encryption off.
func PatientKey(kr *crypt.Keyring, id string) string { return kr.BlindIndex(patientPurpose, id) }

// UnindexedPatient is what patient_key holds for a message that names a
// patient but was stored without keys: never the identifier itself, which
// a reader of the table would see; `mefor keys rotate` indexes it from the
// body once keys are set.
const UnindexedPatient = "unindexed"

// PatientKeys is every form id may be stored under: its blind index under
// each key of the ring (values indexed before a rotation keep the old
// key's), or the id itself with encryption off.
func PatientKeys(kr *crypt.Keyring, id string) []string { return kr.BlindIndexes(patientPurpose, id) }

// OpenText opens an error or event text of message id for display. A text
// that cannot be opened is shown as a note saying why, never as its
// ciphertext: an operator reading a timeline without the key still sees
// its shape.
func OpenText(kr *crypt.Keyring, id int64, s string) string {
	out, err := kr.OpenString(ColError, MessageRow(id), s)
	if err == nil {
		return out
	}
	var mk *crypt.MissingKeyError
	var ue *crypt.UnboundError
	if errors.As(err, &ue) && !ue.Legacy {
		// Error texts are also written in clear by SQL and by mefor itself
		// (an orphan's reason); they are shown, never sent.
		return s
	}
	if errors.As(err, &mk) {
		return fmt.Sprintf("[encrypted under key %s, which %s does not hold here]", mk.KeyID, crypt.EnvKeys)
	}
	return "[encrypted text that does not open: altered or moved]"
}
