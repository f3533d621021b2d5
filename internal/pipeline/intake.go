package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mefor/mefor/internal/dbpool"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/hl7"
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
	// IDs, when set with Keys, hands out the message ids sealing needs
	// ahead of the insert from blocks it drew; nil draws them per batch.
	IDs *MessageIDs

	// ParseError, when set, is why the message could not be parsed (never
	// containing message content). The message is stored with status error
	// for inspection and gets no stage work.
	ParseError string
	// KeepUnparseable, when positive, is how many bytes of Raw are stored
	// for a message that did not parse: a longer body is cut there, with
	// its full length as its size and the cut recorded (cut_at). Zero
	// stores it whole.
	KeepUnparseable int

	// LeaseOwner, when set, makes the store refuse the message unless this
	// node holds a live listener lease, checked in the same transaction: a
	// node that lost the lease (frozen, cut off) cannot store, and so never
	// acknowledges, anything once another node may be listening.
	LeaseOwner string
}

// ParseInbound parses raw, received on channel from source, into the
// Inbound intake stores: its header fields and patient id when it parses,
// its ParseError (never quoting content) when it does not, which is
// returned too. Listeners and `mefor enqueue` store the same fields.
func ParseInbound(channel, source, remote string, raw []byte) (Inbound, *hl7.Message, error) {
	in := Inbound{Channel: channel, Source: source, RemoteAddr: remote, Raw: raw}
	msg, err := hl7.Parse(raw)
	if err != nil {
		in.ParseError = "not a valid HL7 v2 message: " + err.Error()
		return in, nil, err
	}
	h := msg.Header()
	in.ControlID = h.ControlID
	in.MessageType = h.MessageType
	in.TriggerEvent = h.TriggerEvent
	in.SendingApp = h.SendingApplication
	in.SendingFacility = h.SendingFacility
	in.PatientID = msg.Get("PID-3.1")
	return in, msg, nil
}

// IntakeDB is what ReceiveBatch needs of a pool: batches sent outside any
// transaction block, and transactions.
type IntakeDB interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Receive durably stores one inbound message in tx: the message row, its
// ingress work row, the received event and the activation of the ingress
// lane's drainer. The sender may be acknowledged only after tx commits.
func Receive(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, in Inbound) (int64, error) {
	ids, _, err := receiveTx(ctx, tx, ins, []Inbound{in}, nil, false)
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// ReceiveBatch durably stores messages, in their order, all or none, and
// returns their ids in that order. The senders may be acknowledged when it
// returns without error: the commit is done.
//
// When every lane written to has a live drainer (the usual case) this costs
// one round trip: the generic-plan settings (PipelineTx), the lease checks,
// the lane locks (sorted), the inserts and the live-drainer check go as one
// batch outside a transaction block, which PostgreSQL runs as one implicit
// transaction, committed when the batch ends unless a statement raised; the
// lease and drainer checks raise, so a refusal rolls back everything. A lane
// without a live drainer makes that batch fail before it writes (or draws
// an id), and the messages are stored again in a transaction that also
// inserts the drainer, as Receive does.
//
// With encryption on, the messages' ids are drawn first, in a round trip of
// their own, because each sealed body is bound to its message's id
// (MessageRow) and so cannot be sealed before the id is known.
func ReceiveBatch(ctx context.Context, db IntakeDB, ins jobs.Inserter, ms []Inbound) ([]int64, error) {
	ids := make([]int64, len(ms))
	pre, err := drawMessageIDs(ctx, db, ms)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue(intakeSettingsSQL)
	queueReceive(b, ms, pre, ids, jobs.QueueLiveDrainerCheck)
	err = db.SendBatch(ctx, b).Close()
	if err == nil {
		return ids, nil
	}
	if !errors.Is(err, jobs.ErrNoLiveDrainer) {
		return nil, fmt.Errorf("store %d messages: %w", len(ms), err)
	}
	// The refused batch wrote nothing: its ids are still free.
	return receiveBatchActivating(ctx, db, ins, ms, pre)
}

// ReceiveBatchActivating stores ms as ReceiveBatch does, in a transaction
// that also inserts the drainers their lanes lack, without first trying
// the one round trip. It is for lanes that have probably no live drainer
// (their last message is older than a drainer lingers): there the one
// round trip is refused, which costs the trip, and an ERROR in the
// server's log for every message of a quiet interface.
//
// The drainers it inserts are announced after the commit
// (jobs.Activation.FinishUnannounced says why), before it returns.
func ReceiveBatchActivating(ctx context.Context, db IntakeDB, ins jobs.Inserter, ms []Inbound) ([]int64, error) {
	return receiveBatchActivating(ctx, db, ins, ms, nil)
}

// receiveBatchActivating is ReceiveBatchActivating with the messages' ids
// drawn ahead (pre), or nil to draw them in its transaction.
func receiveBatchActivating(ctx context.Context, db IntakeDB, ins jobs.Inserter, ms []Inbound, pre []int64) ([]int64, error) {
	var ids []int64
	var act *jobs.Activation
	err := pgx.BeginTxFunc(ctx, db, PipelineTxTimeouts(dbpool.Intake), func(tx pgx.Tx) error {
		var err error
		ids, act, err = receiveTx(ctx, tx, ins, ms, pre, true)
		return err
	})
	if err != nil {
		return nil, err
	}
	// The messages are stored: an error now must not reach the senders,
	// who would send them again. A lost announcement delays the drainers
	// until River's producers poll.
	b := &pgx.Batch{}
	QueueGenericPlans(b)
	if act.QueueAnnouncement(b) {
		_ = db.SendBatch(ctx, b).Close()
	}
	return ids, nil
}

// receiveTx stores ms in tx, inserting the drainers their lanes lack, under
// ids pre when drawn ahead (nil: drawn here, when sealed). With
// later set, the drainers are not announced at commit: the caller announces
// them with the returned activation once tx has committed.
func receiveTx(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ms []Inbound, pre []int64, later bool) ([]int64, *jobs.Activation, error) {
	ids := make([]int64, len(ms))
	if pre == nil {
		var err error
		if pre, err = drawMessageIDs(ctx, tx, ms); err != nil {
			return nil, nil, err
		}
	}
	var act *jobs.Activation
	b := &pgx.Batch{}
	queueReceive(b, ms, pre, ids, func(b *pgx.Batch, lanes []string) { act = jobs.QueueActivation(b, lanes) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("store %d messages: %w", len(ms), err)
	}
	finish := act.Finish
	if later {
		finish = act.FinishUnannounced
	}
	if err := finish(ctx, tx, ins); err != nil {
		return nil, nil, err
	}
	return ids, act, nil
}

// batchSender is what drawMessageIDs needs: a pool, a connection or a
// transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// drawMessageIDs draws an id for each message of ms, ascending in ms's
// order, when they are sealed (encryption on); nil otherwise, and the
// insert draws them. Ids drawn for messages that end up not stored (a
// batch refused) are gaps, as an identity column leaves anyway.
func drawMessageIDs(ctx context.Context, db batchSender, ms []Inbound) ([]int64, error) {
	if len(ms) == 0 || !ms[0].Keys.Enabled() {
		return nil, nil
	}
	if ms[0].IDs != nil {
		return ms[0].IDs.Take(ctx, db, len(ms))
	}
	return DrawMessageIDs(ctx, db, len(ms))
}

// MessageIDs hands out message ids drawn ahead in blocks, so that sealed
// intake under load draws ids once per Block messages instead of once per
// batch (a round trip every commit waited for). Ids older than MaxAge are
// dropped unused (gaps, as an identity column leaves anyway): listings
// take id order for receipt order, and a block drawn long ago would
// number a message received now before ones stored since. Safe for
// concurrent use; the zero value is ready.
type MessageIDs struct {
	// Block is how many ids one draw takes at least. Defaults to 64.
	Block int
	// MaxAge is how long drawn ids may wait to be used. Defaults to 1s.
	MaxAge time.Duration

	mu    sync.Mutex
	free  []int64 // ascending
	drawn time.Time
}

// Take returns n ids, ascending, after every id it returned before.
func (a *MessageIDs) Take(ctx context.Context, db batchSender, n int) ([]int64, error) {
	block, maxAge := a.Block, a.MaxAge
	if block <= 0 {
		block = 64
	}
	if maxAge <= 0 {
		maxAge = time.Second
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Since(a.drawn) > maxAge {
		a.free = nil
	}
	if len(a.free) < n {
		// Drawn after the ids held, so the list stays ascending.
		more, err := DrawMessageIDs(ctx, db, max(block, n-len(a.free)))
		if err != nil {
			return nil, err
		}
		if len(a.free) == 0 {
			a.drawn = time.Now()
		}
		a.free = append(a.free, more...)
	}
	out := slices.Clone(a.free[:n])
	a.free = a.free[n:]
	return out, nil
}

// DrawMessageIDs draws n ids of mefor_message from its identity sequence,
// ascending, in one round trip, for writers that must seal a message's
// content before inserting it (a sealed value is bound to its message's
// id); they insert with OVERRIDING SYSTEM VALUE.
func DrawMessageIDs(ctx context.Context, db batchSender, n int) ([]int64, error) {
	b := &pgx.Batch{}
	var ids []int64
	b.Queue(`SELECT nextval(s::regclass) FROM pg_get_serial_sequence('mefor_message', 'id') s, generate_series(1, $1) ORDER BY 1`, n).
		Query(func(rows pgx.Rows) error {
			var err error
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("draw %d message ids: %w", n, err)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("drew %d of %d message ids", len(ids), n)
	}
	return ids, nil
}

// queueReceive queues on b the writes that store ms, in this order: the lease
// checks, the lanes' locks (sorted, as every writer takes them), the lanes'
// activation check (queued by activate, under the locks, and before any
// insert, so a batch it fails has drawn no ids), the parsed messages in one
// statement, each malformed one in its own. ids are filled in as the batch's
// results are read.
//
// seq is drawn under the lane lock in the order of ms (ids, then work rows,
// are inserted in that order), so two messages of one lane keep the order
// they arrived in. pre, when not nil, are the messages' ids, drawn ahead
// (drawMessageIDs), ascending in ms's order.
func queueReceive(b *pgx.Batch, ms []Inbound, pre, ids []int64, activate func(b *pgx.Batch, lanes []string)) {
	var owners []string
	for _, in := range ms {
		if in.LeaseOwner != "" && !slices.Contains(owners, in.LeaseOwner) {
			owners = append(owners, in.LeaseOwner)
			leader.QueueLeaseCheck(b, in.LeaseOwner)
		}
	}
	var parsed []int // indexes into ms
	var lanes []string
	for i, in := range ms {
		if in.ParseError == "" {
			parsed = append(parsed, i)
			lanes = append(lanes, jobs.IngressLane(in.Channel))
		}
	}
	jobs.QueueLocks(b, lanes)
	activate(b, lanes)
	if len(parsed) > 0 {
		queueParsed(b, ms, parsed, pre, ids)
	}
	for i, in := range ms {
		if in.ParseError != "" {
			var id int64
			if pre != nil {
				id = pre[i]
			}
			queueMalformed(b, in, id, &ids[i])
		}
	}
}

// queueParsed queues one statement storing the parsed messages ms[idx...]:
// their messages, received events and ingress rows, inserted in idx order.
func queueParsed(b *pgx.Batch, ms []Inbound, idx []int, pre, ids []int64) {
	n := len(idx)
	channel, source, remote, ident, lane := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	c := newMessageColumns(n)
	var given []int64
	for k, i := range idx {
		in := ms[i]
		channel[k], source[k], remote[k], ident[k], lane[k] = in.Channel, in.Source, in.RemoteAddr, in.SourceIdentity, jobs.IngressLane(in.Channel)
		var id int64
		if pre != nil {
			id = pre[i]
			given = append(given, id)
		}
		c.set(k, in.Keys, id, in)
	}
	// The message ids are drawn (or were, ascending) in u.n order, and the
	// work rows (with their seq) in id order, so ids and seq follow idx.
	idCol, idVal, override := "", "", ""
	if given != nil {
		idCol, idVal, override = "id, ", "($14::bigint[])[n], ", " OVERRIDING SYSTEM VALUE"
	}
	args := []any{channel, source, remote, c.ctrl, c.typ, c.trig, c.app, c.fac, c.size, c.raw, ident, c.patient, lane}
	if given != nil {
		args = append(args, given)
	}
	b.Queue(`
		WITH u AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
				$8::text[], $9::int4[], $10::bytea[], $11::text[], $12::text[], $13::text[])
				WITH ORDINALITY AS u(channel, source, remote, ctrl, typ, trig, app, fac, size, raw, ident, patient, lane, n)
		), m AS (
			INSERT INTO mefor_message (`+idCol+`channel, source, remote_addr, control_id, message_type, trigger_event,
				sending_app, sending_facility, size, raw, status, source_identity, patient_key)`+override+`
			SELECT `+idVal+`channel, source, NULLIF(remote, ''), NULLIF(ctrl, ''), NULLIF(typ, ''), NULLIF(trig, ''),
				NULLIF(app, ''), NULLIF(fac, ''), size, raw, 'received', NULLIF(ident, ''), NULLIF(patient, '')
			FROM u ORDER BY n
			RETURNING id, channel, source
		), e AS (
			INSERT INTO mefor_event (message_id, event, detail) SELECT id, 'received', source FROM m ORDER BY id
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel)
		SELECT m.id, 'ingress', l.lane, m.channel
		FROM m JOIN (SELECT DISTINCT channel, lane FROM u) l ON l.channel = m.channel
		ORDER BY m.id
		RETURNING message_id`, args...).Query(func(rows pgx.Rows) error {
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if len(got) != n {
			return fmt.Errorf("stored %d of %d messages", len(got), n)
		}
		slices.Sort(got)
		for k, i := range idx {
			ids[i] = got[k]
		}
		return nil
	})
}

// queueMalformed queues the statement storing a message that did not
// parse, with status error and its raw body (or its first KeepUnparseable
// bytes) for inspection, its received and failed events, and no stage work.
// pre is its id when drawn ahead (drawMessageIDs), else 0.
func queueMalformed(b *pgx.Batch, in Inbound, pre int64, id *int64) {
	at := MessageRow(pre)
	sealedErr := in.Keys.SealString(ColError, at, in.ParseError)
	raw, cutAt := in.Raw, 0
	if in.KeepUnparseable > 0 && len(raw) > in.KeepUnparseable {
		raw, cutAt = raw[:in.KeepUnparseable], in.KeepUnparseable
	}
	idCol, idVal, override := "", "", ""
	if pre != 0 {
		idCol, idVal, override = "id, ", fmt.Sprintf("%d, ", pre), " OVERRIDING SYSTEM VALUE"
	}
	b.Queue(`
		WITH m AS (
			INSERT INTO mefor_message (`+idCol+`channel, source, remote_addr, size, raw, status, error, source_identity, cut_at)`+override+`
			VALUES (`+idVal+`$1, $2, NULLIF($3, ''), $4, $5, 'error', $6, NULLIF($7, ''), NULLIF($10, 0))
			RETURNING id
		)
		INSERT INTO mefor_event (message_id, event, detail)
		SELECT m.id, e.event, e.detail FROM m, (VALUES (1, $8, $2), (2, $9, $6)) AS e(k, event, detail)
		ORDER BY e.k
		RETURNING message_id`,
		in.Channel, in.Source, in.RemoteAddr, len(in.Raw), in.Keys.Seal(ColRaw, at, raw), sealedErr,
		in.SourceIdentity, EventReceived, EventFailed, cutAt).Query(func(rows pgx.Rows) error {
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if len(got) == 0 {
			return errors.New("malformed message not stored")
		}
		*id = got[0]
		return nil
	})
}

// messageColumns hold, one slice per column for an unnest, what every
// stored message writes of itself: the sealed body with its plaintext size,
// the header fields as a text column can hold them, and the patient key.
type messageColumns struct {
	raw                                [][]byte
	size                               []int32
	ctrl, typ, trig, app, fac, patient []string
}

func newMessageColumns(n int) *messageColumns {
	return &messageColumns{raw: make([][]byte, n), size: make([]int32, n),
		ctrl: make([]string, n), typ: make([]string, n), trig: make([]string, n),
		app: make([]string, n), fac: make([]string, n), patient: make([]string, n)}
}

// set fills row k from in, sealing (for message id, drawn ahead) and
// blinding with kr.
func (c *messageColumns) set(k int, kr *crypt.Keyring, id int64, in Inbound) {
	// Size is the plaintext's, the body is sealed.
	c.raw[k], c.size[k] = kr.Seal(ColRaw, MessageRow(id), in.Raw), int32(len(in.Raw))
	c.ctrl[k], c.typ[k], c.trig[k] = ColumnText(in.ControlID), ColumnText(in.MessageType), ColumnText(in.TriggerEvent)
	c.app[k], c.fac[k] = ColumnText(in.SendingApp), ColumnText(in.SendingFacility)
	c.patient[k] = patientKey(kr, in.PatientID)
}

// patientKey is the stored form of a patient id; "" stays "" (NULL). With
// encryption off it is UnindexedPatient: a clear identifier is never kept,
// so patients are searchable only with keys.
func patientKey(kr *crypt.Keyring, id string) string {
	if id == "" {
		return ""
	}
	if !kr.Enabled() {
		return UnindexedPatient
	}
	return PatientKey(kr, ColumnText(id))
}

// ColumnText is a header field as a text column can hold it. Senders do
// send bytes that are not UTF-8 (a Latin-1 facility name) or hold NUL, and
// PostgreSQL refuses such text: the message would not be stored, the
// sender would get no ACK and would resend it forever. The searchable copy
// gets U+FFFD in their place; the stored body keeps the bytes as sent.
func ColumnText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
