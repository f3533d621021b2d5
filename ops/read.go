package ops

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/mefor/mefor/internal/auditforward"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/retention"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/migrations"
)

// Message and status types, as ops returns them.
type (
	// MessageFilter narrows ListMessages.
	MessageFilter = search.MessageFilter
	// MessageSummary is one message of a listing (metadata only).
	MessageSummary = search.MessageSummary
	// WorkInfo is one stage or delivery row of a message.
	WorkInfo = search.WorkInfo
	// Reply is a partner's answer to one delivery.
	Reply = search.Reply
	// Event is one entry of a message's timeline.
	Event = search.Event
	// Outbound is one delivery's payload as sent.
	Outbound = search.Outbound
	// Origin is where a message came from and the replies routed back in.
	Origin = search.Origin
	// LinkedMessage is a message linked to another (a reply routed in).
	LinkedMessage = search.LinkedMessage
	// DeadFilter narrows ListDead and ReplayDead.
	DeadFilter = pipeline.DeadFilter
	// DeadRow is one dead-lettered delivery.
	DeadRow = search.DeadRow
	// Alert is one alert rule's state.
	Alert = alert.Alert
	// StatusReport is what Status returns: counts per channel and
	// destination, each node's config, retention, transport and
	// encryption.
	StatusReport = search.Status
	// TransportStatus is the certificates and listeners the live nodes use.
	TransportStatus = nodeinfo.TransportStatus
	// NodeCertificate is one certificate a node loaded.
	NodeCertificate = nodeinfo.NodeCertificate
	// EncryptionStatus is how many bodies each key encrypts.
	EncryptionStatus = nodeinfo.EncryptionStatus
	// EgressStatus is where the live nodes let data go.
	EgressStatus = nodeinfo.EgressStatus
	// PlaintextOutbound is a connection in plaintext to another machine.
	PlaintextOutbound = nodeinfo.PlaintextOutbound
)

// Message statuses (a message's status field).
const (
	StatusReceived  = pipeline.StatusReceived
	StatusRouted    = pipeline.StatusRouted
	StatusUnrouted  = pipeline.StatusUnrouted
	StatusFiltered  = pipeline.StatusFiltered
	StatusProcessed = pipeline.StatusProcessed
	StatusError     = pipeline.StatusError
)

// ErrPatientSearchNeedsKeys is a search by patient without encryption keys
// (search.ErrPatientSearchNeedsKeys).
var ErrPatientSearchNeedsKeys = search.ErrPatientSearchNeedsKeys

// ErrNotFound is returned for a message id that does not exist.
var ErrNotFound = pipeline.ErrNotFound

// ListMessages returns messages newest first (metadata only). A search of
// the bodies (f.Text) reads content, and a search by patient (f.Patient)
// tells where a patient was treated, so both are audited like a body view.
// A search by patient and its audit row share one transaction. A search
// of the bodies reads them page by page through mefor_search_bodies, which
// records each page's bodies read in that page's transaction; a last row
// records what it found. The rows record that a search ran and what it
// read and found, never the text or identifier searched for.
func ListMessages(ctx context.Context, pool *pgxpool.Pool, f search.MessageFilter) ([]search.MessageSummary, error) {
	if f.Patient != "" && !f.Keys.Enabled() {
		// Who may search by patient is answered first, as with keys.
		if err := migrations.RequireRole(ctx, pool, migrations.RoleOperator, "searching messages by patient"); err != nil {
			return nil, err
		}
		return nil, ErrPatientSearchNeedsKeys
	}
	if f.Text == "" && f.Patient == "" {
		return search.ListMessages(ctx, pool, f)
	}
	var out []search.MessageSummary
	action := audit.ActionSearchPatient
	target := map[string]any{"channel": f.Channel, "destination": f.Destination}
	if f.Text != "" {
		action, target["text_bytes"] = audit.ActionSearchBodies, len(f.Text)
	}
	if f.Patient != "" {
		target["by_patient"] = true
	}
	found := func() {
		ids := make([]int64, len(out))
		for i, m := range out {
			ids[i] = m.ID
		}
		target["message_ids"] = ids
	}
	if f.Text != "" {
		var err error
		if out, err = search.ListMessages(ctx, pool, f); err != nil {
			recordFailure(ctx, pool, action, target, err)
			return nil, err
		}
		found()
		if err := audit.AppendAlone(ctx, pool, audit.Entry{Action: action, Target: target}); err != nil {
			return nil, err
		}
		return out, nil
	}
	err := audited(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, action, target,
		func(tx pgx.Tx) (string, error) {
			var err error
			if out, err = search.ListMessages(ctx, tx, f); err != nil {
				return "", err
			}
			found()
			return "", nil
		})
	return out, err
}

// MessageView is everything `messages show` presents about one message.
type MessageView = search.MessageView

// ShowMessage reads one message with its stage rows, partner replies,
// timeline and origin (file, parent, replies routed in), all from one
// snapshot. Bodies (the message's and the replies')
// are read only when withBody is set. An unknown id wraps pipeline.ErrNotFound.
//
// Reading bodies is audited: the reads and the audit row share one
// transaction, so no body is returned unless its viewing was recorded.
//
// kr opens what was sealed: the bodies (an error naming the key when one
// does not open, never its ciphertext) and the error and event texts (a
// note in their place when they do not open).
func ShowMessage(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, id int64, withBody bool) (*MessageView, error) {
	return ShowMessageIn(ctx, pool, kr, id, withBody, nil)
}

// ShowMessageIn is ShowMessage for someone who sees only the channels
// sees accepts (a user's channel scope; nil sees all): a message of
// another channel is ErrNotFound, as one that does not exist, and none of
// its rows or bodies is read past its header. When ctx names a mefor user
// (audit.WithActor, as the API does), a body view also appends a
// view-body row naming them, in the transaction that reads the bodies.
func ShowMessageIn(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, id int64, withBody bool,
	sees func(channel string) bool) (*MessageView, error) {
	var v MessageView
	read := func(tx pgx.Tx) error {
		var err error
		if v.Message, err = search.GetMessage(ctx, tx, id, false); err != nil {
			return err
		}
		if sees != nil && !sees(v.Message.Channel) {
			v = MessageView{}
			return fmt.Errorf("message %d: %w", id, pipeline.ErrNotFound)
		}
		if v.Work, err = search.MessageWork(ctx, tx, id); err != nil {
			return err
		}
		if v.Replies, err = search.MessageReplies(ctx, tx, id, false); err != nil {
			return err
		}
		if v.Events, err = search.MessageEvents(ctx, tx, id); err != nil {
			return err
		}
		if v.Origin, err = search.MessageOrigin(ctx, tx, id); err != nil {
			return err
		}
		// A reply routed in from another channel's delivery: its parent
		// is that channel's message, which is out of scope.
		if sees != nil && v.Origin.Parent != nil && !sees(v.Origin.Parent.Channel) {
			v.Origin.Parent = nil
		}
		return nil
	}
	var err error
	switch {
	case withBody:
		// The bodies come last, through mefor_read_body, which appends the
		// view-body row itself, naming the person when there is one: an
		// operator cannot read them otherwise.
		target := map[string]any{"message_id": id}
		err = audited(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, audit.ActionViewBody, target,
			func(tx pgx.Tx) (string, error) {
				if err := read(tx); err != nil {
					return "", err
				}
				osUser, host := audit.Who()
				b, err := search.ReadBodies(ctx, tx, id, osUser, host, audit.ActorOf(ctx))
				if err != nil {
					return "", err
				}
				v.Message.Raw = b.Raw
				for i := range v.Replies {
					v.Replies[i].Body = b.Replies[v.Replies[i].ID]
				}
				v.Outbound = search.MessageOutbound(v.Work, b)
				return noAudit, nil
			})
	case kr.Enabled():
		// The error and event texts it opens can quote the message.
		err = audited(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, audit.ActionViewErrors,
			map[string]any{"message_id": id}, func(tx pgx.Tx) (string, error) { return "", read(tx) })
	default:
		err = readTx(ctx, pool, read)
	}
	if err != nil {
		return nil, err
	}
	if err := openView(kr, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// openView opens the sealed parts of a message view in place.
func openView(kr *crypt.Keyring, v *MessageView) error {
	var err error
	v.Message.Error = pipeline.OpenText(kr, v.Message.ID, v.Message.Error)
	for i := range v.Work {
		v.Work[i].LastError = pipeline.OpenText(kr, v.Message.ID, v.Work[i].LastError)
	}
	for i := range v.Events {
		v.Events[i].Detail = pipeline.OpenText(kr, v.Message.ID, v.Events[i].Detail)
	}
	if p := v.Origin.Parent; p != nil {
		p.Error = pipeline.OpenText(kr, p.ID, p.Error)
	}
	for i := range v.Origin.Replies {
		v.Origin.Replies[i].Error = pipeline.OpenText(kr, v.Origin.Replies[i].ID, v.Origin.Replies[i].Error)
	}
	if v.Message.Raw, err = kr.Open(pipeline.ColRaw, pipeline.MessageRow(v.Message.ID), v.Message.Raw); err != nil {
		return fmt.Errorf("message %d: %w", v.Message.ID, err)
	}
	for i := range v.Replies {
		if v.Replies[i].Body, err = kr.Open(pipeline.ColReply, pipeline.MessageRow(v.Message.ID), v.Replies[i].Body); err != nil {
			return fmt.Errorf("message %d, reply %d: %w", v.Message.ID, v.Replies[i].ID, err)
		}
	}
	for i := range v.Outbound {
		if v.Outbound[i].Payload, err = kr.Open(pipeline.ColPayload, pipeline.MessageRow(v.Message.ID), v.Outbound[i].Payload); err != nil {
			return fmt.Errorf("message %d, row %d: %w", v.Message.ID, v.Outbound[i].WorkID, err)
		}
	}
	return nil
}

// FindMessage resolves what an operator typed to name a message: a
// numeric message id when such a message exists, else a control id
// (MSH-10). It returns the id found, or, when the control id matches
// several messages (or none), the matches, newest first, and id 0. also
// lists the other messages whose control id is ref when ref named a
// message by its id.
func FindMessage(ctx context.Context, pool *pgxpool.Pool, ref string) (id int64, matches, also []search.MessageSummary, err error) {
	const most = 20
	byControl, err := search.MessagesByControlID(ctx, pool, ref, most)
	if err != nil {
		return 0, nil, nil, err
	}
	if n, perr := strconv.ParseInt(ref, 10, 64); perr == nil && n > 0 {
		_, gerr := search.GetMessage(ctx, pool, n, false)
		switch {
		case gerr == nil:
			for _, m := range byControl {
				if m.ID != n {
					also = append(also, m)
				}
			}
			return n, nil, also, nil
		case !errors.Is(gerr, pipeline.ErrNotFound):
			return 0, nil, nil, gerr
		}
	}
	if len(byControl) == 1 {
		return byControl[0].ID, nil, nil, nil
	}
	return 0, byControl, nil, nil
}

// ListAlerts returns the state of every alert rule the cluster evaluated.
func ListAlerts(ctx context.Context, pool *pgxpool.Pool) ([]alert.Alert, error) {
	return alert.ListAlerts(ctx, pool)
}

// ListDead returns dead rows of every stage, most recently dead first.
//
// Their errors are opened with kr; that reads content (an error can quote
// the message), so the read and its audit row then share one transaction.
func ListDead(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, f pipeline.DeadFilter) ([]search.DeadRow, error) {
	return ListDeadIn(ctx, pool, kr, f, nil)
}

// ListDeadIn is ListDead for someone who sees only the channels scope's
// patterns match (a user's channel scope; empty sees all), applied in the
// query.
func ListDeadIn(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, f pipeline.DeadFilter, scope []string) ([]search.DeadRow, error) {
	var rows []search.DeadRow
	if !kr.Enabled() {
		// Sealed texts are only named (their key), not opened.
		rows, err := search.ListDead(ctx, pool, f, scope)
		for i := range rows {
			rows[i].LastError = pipeline.OpenText(kr, rows[i].MessageID, rows[i].LastError)
		}
		return rows, err
	}
	target := map[string]any{"dead_list": true, "channel": f.Channel, "destination": f.Destination}
	err := audited(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, audit.ActionViewErrors, target,
		func(tx pgx.Tx) (string, error) {
			var err error
			if rows, err = search.ListDead(ctx, tx, f, scope); err != nil {
				return "", err
			}
			ids := make([]int64, len(rows))
			for i, r := range rows {
				ids[i] = r.MessageID
			}
			target["message_ids"] = ids
			return "", nil
		})
	if err != nil {
		return nil, err
	}
	for i := range rows {
		rows[i].LastError = pipeline.OpenText(kr, rows[i].MessageID, rows[i].LastError)
	}
	return rows, err
}

// Status returns the per-channel and per-destination counts from one
// snapshot.
func Status(ctx context.Context, pool *pgxpool.Pool) (*search.Status, error) {
	var st *search.Status
	err := readTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		st, err = search.ReadStatus(ctx, tx)
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
		rs, err := retention.ReadStatus(ctx, tx)
		st.Retention = &rs
		if err != nil {
			return err
		}
		if st.Transport, err = nodeinfo.ReadTransportStatus(ctx, tx); err != nil {
			return err
		}
		if st.Encryption, err = nodeinfo.ReadEncryptionStatus(ctx, tx); err != nil {
			return err
		}
		if st.Egress, err = nodeinfo.ReadEgressStatus(ctx, tx); err != nil {
			return err
		}
		st.AuditForward, err = auditforward.ReadStatus(ctx, tx)
		return err
	})
	return st, err
}

var _ api.Reads = APIReads{}

// APIReads is what the API's read endpoints call (api.Reads): the
// functions above, over the node's pool, opening content with its keys.
type APIReads struct {
	Pool *pgxpool.Pool
	Keys *crypt.Keyring
}

// Status is Status.
func (a APIReads) Status(ctx context.Context) (*search.Status, error) { return Status(ctx, a.Pool) }

// Nodes is ListNodes.
func (a APIReads) Nodes(ctx context.Context) ([]Node, error) { return ListNodes(ctx, a.Pool) }

// Alerts is ListAlerts.
func (a APIReads) Alerts(ctx context.Context) ([]alert.Alert, error) { return ListAlerts(ctx, a.Pool) }

// Messages is ListMessages, blinding a patient identifier with the keys.
func (a APIReads) Messages(ctx context.Context, f search.MessageFilter) ([]search.MessageSummary, error) {
	f.Keys = a.Keys
	return ListMessages(ctx, a.Pool, f)
}

// Message is ShowMessageIn.
func (a APIReads) Message(ctx context.Context, id int64, withBody bool, sees func(string) bool) (*MessageView, error) {
	return ShowMessageIn(ctx, a.Pool, a.Keys, id, withBody, sees)
}

// Dead is ListDeadIn.
func (a APIReads) Dead(ctx context.Context, f DeadFilter, scope []string) ([]DeadRow, error) {
	return ListDeadIn(ctx, a.Pool, a.Keys, f, scope)
}

// Audit is ListAudit.
func (a APIReads) Audit(ctx context.Context, f AuditFilter) ([]AuditRecord, error) {
	return ListAudit(ctx, a.Pool, f)
}
