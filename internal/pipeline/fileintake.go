package pipeline

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
)

// SourceFile is the source of messages read from a directory.
const SourceFile = "file"

// IntakeFile is one file of a directory channel, split into messages that
// all parsed, as intake stores it.
type IntakeFile struct {
	Channel string
	// Name is the file's name in the channel's directory.
	Name   string
	Size   int64
	SHA256 [sha256.Size]byte
	// Messages are in file order; only Raw and the header fields are read.
	Messages []Inbound
	// LeaseOwner, when set, makes the store refuse the file unless this
	// node holds a live listener lease, as Inbound.LeaseOwner does; it is
	// recorded as the node that took the file.
	LeaseOwner string
	// Keys seals the bodies and blinds the patient ids, as Inbound.Keys.
	Keys *crypt.Keyring
}

// FileReceipt is what ReceiveFile did.
type FileReceipt struct {
	// FileID is the file's record, made now or by the store that made
	// this one a duplicate.
	FileID int64
	// MessageIDs are the messages stored now, in file order; none for a
	// duplicate.
	MessageIDs []int64
	// Duplicate is set when the same file (channel, name, size and hash)
	// was stored before: nothing was stored now, and the caller only has
	// to move the file away, which the earlier store did not get to do.
	Duplicate bool
	// StoredAt and Messages describe the file's record.
	StoredAt time.Time
	Messages int
}

// ReceiveFile durably stores every message of a file in tx, in file order
// (their ingress seqs follow the file), with the file's record: name, size
// and hash. The caller moves or deletes the file only after tx commits. A
// file already recorded stores nothing and says so (Duplicate), so a node
// that stopped between the commit and the move, or another node taking the
// directory over, never stores a file twice. One round trip, plus one to
// activate the ingress lane's drainer when it has none, and with encryption
// on one to draw the messages' ids, which their sealed bodies are bound to.
func ReceiveFile(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, f IntakeFile) (FileReceipt, error) {
	lane := jobs.IngressLane(f.Channel)
	n := len(f.Messages)
	c := newMessageColumns(n)
	var pre []int64
	if f.Keys.Enabled() && n > 0 {
		var err error
		if pre, err = DrawMessageIDs(ctx, tx, n); err != nil {
			return FileReceipt{}, fmt.Errorf("store file %s of channel %s: %w", f.Name, f.Channel, err)
		}
	}
	idCol, idVal, override := "", "", ""
	if pre != nil {
		idCol, idVal, override = "id, ", "($17::bigint[])[u.n], ", " OVERRIDING SYSTEM VALUE"
	}
	for i, m := range f.Messages {
		var id int64
		if pre != nil {
			id = pre[i]
		}
		c.set(i, f.Keys, id, m)
	}
	args := []any{f.Channel, f.Name, f.Size, f.SHA256[:], n, c.raw, c.ctrl, c.typ, c.trig, c.app, c.fac, SourceFile, lane, f.LeaseOwner,
		c.size, c.patient}
	if pre != nil {
		args = append(args, pre)
	}
	b := &pgx.Batch{}
	if f.LeaseOwner != "" {
		leader.QueueLeaseCheck(b, f.LeaseOwner)
	}
	jobs.QueueLocks(b, []string{lane})
	var r FileReceipt
	b.Queue(`
		WITH f AS (
			INSERT INTO mefor_intake_file (channel, name, size, sha256, messages, node_id)
			VALUES ($1, $2, $3, $4, $5, NULLIF($14, ''))
			ON CONFLICT (channel, name, size, sha256) DO NOTHING
			RETURNING id
		), m AS (
			INSERT INTO mefor_message (`+idCol+`channel, source, control_id, message_type, trigger_event, sending_app,
				sending_facility, size, raw, status, source_file_id, source_file_index, patient_key)`+override+`
			SELECT `+idVal+`$1, $12, NULLIF(u.ctrl, ''), NULLIF(u.typ, ''), NULLIF(u.trig, ''), NULLIF(u.app, ''), NULLIF(u.fac, ''),
				u.size, u.raw, 'received', f.id, u.n, NULLIF(u.patient, '')
			FROM f CROSS JOIN unnest($6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $15::int4[], $16::text[])
				WITH ORDINALITY AS u(raw, ctrl, typ, trig, app, fac, size, patient, n)
			ORDER BY u.n
			RETURNING id, source_file_index
		), e AS (
			INSERT INTO mefor_event (message_id, event, detail)
			SELECT id, 'received', format('file %s, message %s of %s', $2::text, source_file_index, $5::int) FROM m
			ORDER BY id
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel)
		SELECT id, 'ingress', $13, $1 FROM m
		ORDER BY id
		RETURNING message_id`, args...).Query(func(rows pgx.Rows) error {
		var err error
		r.MessageIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	b.Queue(`SELECT id, stored_at, messages FROM mefor_intake_file WHERE channel = $1 AND name = $2 AND size = $3 AND sha256 = $4`,
		f.Channel, f.Name, f.Size, f.SHA256[:]).QueryRow(func(row pgx.Row) error {
		return row.Scan(&r.FileID, &r.StoredAt, &r.Messages)
	})
	act := jobs.QueueActivation(b, []string{lane})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return FileReceipt{}, fmt.Errorf("store file %s of channel %s: %w", f.Name, f.Channel, err)
	}
	slices.Sort(r.MessageIDs) // file order: ids are drawn in it
	r.Duplicate = len(r.MessageIDs) == 0
	if r.Duplicate {
		return r, nil
	}
	if err := act.Finish(ctx, tx, ins); err != nil {
		return FileReceipt{}, err
	}
	return r, nil
}
