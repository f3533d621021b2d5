// Package search holds the operators' reads: messages and their story
// (work rows, events, replies, links), text and patient search, dead
// letters, status and backlog counts. Its reads may join any table; it
// writes none.
package search

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/dbpool"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/retention"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
)

// The operator reads: message listing and detail, dead letters, and the
// per-channel / per-destination status counts. None of them returns a body
// unless asked to, and none puts message content into an error.

// DefaultListLimit is how many rows a listing returns when no limit is given.
const DefaultListLimit = 50

// MessageSummary is one line of `mefor messages list`.
type MessageSummary struct {
	ID           int64     `json:"id"`
	ReceivedAt   time.Time `json:"received_at"`
	Channel      string    `json:"channel"`
	MessageType  string    `json:"message_type,omitempty"`
	TriggerEvent string    `json:"trigger_event,omitempty"`
	ControlID    string    `json:"control_id,omitempty"`
	Status       string    `json:"status"`
	// Size is the message's length as received, in bytes.
	Size int `json:"size"`
	// CutAt, when not zero, is how many bytes of the body were kept: an
	// unparseable frame longer than its listener's keep_unparseable is
	// stored cut there.
	CutAt int `json:"cut_at,omitempty"`
}

// Type is the message type as HL7 writes it, e.g. "ADT^A01"; empty when the
// message did not parse.
func (m MessageSummary) Type() string {
	if m.TriggerEvent == "" {
		return m.MessageType
	}
	return m.MessageType + "^" + m.TriggerEvent
}

// MessageDetail is the header of `mefor messages show`.
type MessageDetail struct {
	MessageSummary
	UpdatedAt  time.Time `json:"updated_at"`
	Source     string    `json:"source"`
	RemoteAddr string    `json:"remote_addr,omitempty"`
	// SourceIdentity is the subject of the sender's verified client
	// certificate (mutual TLS).
	SourceIdentity  string     `json:"source_identity,omitempty"`
	SendingApp      string     `json:"sending_app,omitempty"`
	SendingFacility string     `json:"sending_facility,omitempty"`
	BodyPurgedAt    *time.Time `json:"body_purged_at,omitempty"`
	Error           string     `json:"error,omitempty"`
	// Raw is the stored body, only when asked for (nil once purged). Callers
	// decide how to present it; it never goes into logs or errors.
	Raw []byte `json:"-"`
}

// GetMessage returns one message's header, and its body when withBody is
// set. pipeline.ErrNotFound when there is no such message.
func GetMessage(ctx context.Context, q pipeline.DBTX, id int64, withBody bool) (MessageDetail, error) {
	var m MessageDetail
	texts, err := textColumn(ctx, q, "error")
	if err != nil {
		return m, err
	}
	err = q.QueryRow(ctx, `
		SELECT id, received_at, channel, coalesce(message_type, ''), coalesce(trigger_event, ''),
			coalesce(control_id, ''), status, size, coalesce(cut_at, 0),
			updated_at, source, coalesce(remote_addr, ''), coalesce(sending_app, ''),
			coalesce(sending_facility, ''), body_purged_at, `+texts+`,
			`+contentColumn(withBody, "raw")+`, coalesce(source_identity, '')
		FROM mefor_message WHERE id = $1`, id).Scan(
		&m.ID, &m.ReceivedAt, &m.Channel, &m.MessageType, &m.TriggerEvent,
		&m.ControlID, &m.Status, &m.Size, &m.CutAt,
		&m.UpdatedAt, &m.Source, &m.RemoteAddr, &m.SendingApp,
		&m.SendingFacility, &m.BodyPurgedAt, &m.Error, &m.Raw, &m.SourceIdentity)
	if errors.Is(err, pgx.ErrNoRows) {
		return MessageDetail{}, fmt.Errorf("message %d: %w", id, pipeline.ErrNotFound)
	}
	if err != nil {
		return MessageDetail{}, fmt.Errorf("read message %d: %w", id, err)
	}
	return m, nil
}

// contentColumn is col when the caller asked for content, else a NULL in
// its place: a query that names a content column at all needs the
// privilege to read it, which mefor_reader does not have.
func contentColumn(withBody bool, col string) string {
	if withBody {
		return col
	}
	return "NULL::bytea"
}

// WorkInfo is one stage row of a message, as an operator sees it.
type WorkInfo struct {
	ID            int64      `json:"id"`
	Stage         string     `json:"stage"`
	Lane          string     `json:"lane"`
	Seq           int64      `json:"seq"`
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"` // pending rows only
	Destination   string     `json:"destination,omitempty"`
	Route         string     `json:"route,omitempty"`
	Handler       string     `json:"handler,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
}

// MessageWork returns every stage row of a message, in the order they were
// created.
func MessageWork(ctx context.Context, q pipeline.DBTX, messageID int64) ([]WorkInfo, error) {
	texts, err := textColumn(ctx, q, "last_error")
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `
		SELECT id, stage, lane, seq, status, attempts, `+texts+`,
			CASE WHEN status = 'pending' THEN next_attempt_at END,
			coalesce(destination, ''), coalesce(route, ''), coalesce(handler, ''),
			created_at, finished_at
		FROM mefor_work WHERE message_id = $1
		ORDER BY id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("read stage rows of message %d: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkInfo, error) {
		var w WorkInfo
		err := r.Scan(&w.ID, &w.Stage, &w.Lane, &w.Seq, &w.Status, &w.Attempts, &w.LastError,
			&w.NextAttemptAt, &w.Destination, &w.Route, &w.Handler, &w.CreatedAt, &w.FinishedAt)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read stage rows of message %d: %w", messageID, err)
	}
	return out, nil
}

// Reply is what a partner answered to one delivery attempt.
type Reply struct {
	ID          int64     `json:"id"`
	WorkID      int64     `json:"work_id"`
	Destination string    `json:"destination"`
	Attempt     int       `json:"attempt"`
	Outcome     string    `json:"outcome"`
	AckCode     string    `json:"ack_code,omitempty"`
	ReceivedAt  time.Time `json:"received_at"`
	// Body is the partner's reply, only when asked for.
	Body []byte `json:"-"`
}

// MessageReplies returns the partner replies recorded for a message's
// deliveries, oldest first; bodies only when withBody is set.
func MessageReplies(ctx context.Context, q pipeline.DBTX, messageID int64, withBody bool) ([]Reply, error) {
	rows, err := q.Query(ctx, `
		SELECT id, work_id, destination, attempt, outcome, coalesce(ack_code, ''), received_at,
			`+contentColumn(withBody, "body")+`
		FROM mefor_response WHERE message_id = $1
		ORDER BY id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("read replies of message %d: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reply, error) {
		var p Reply
		err := r.Scan(&p.ID, &p.WorkID, &p.Destination, &p.Attempt, &p.Outcome, &p.AckCode,
			&p.ReceivedAt, &p.Body)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read replies of message %d: %w", messageID, err)
	}
	return out, nil
}

// Event is one entry of a message's timeline.
type Event struct {
	ID          int64     `json:"id"`
	At          time.Time `json:"at"`
	Event       string    `json:"event"`
	WorkID      int64     `json:"work_id,omitempty"`
	Destination string    `json:"destination,omitempty"`
	Detail      string    `json:"detail,omitempty"`
}

// MessageEvents returns a message's timeline, oldest first.
func MessageEvents(ctx context.Context, q pipeline.DBTX, messageID int64) ([]Event, error) {
	texts, err := textColumn(ctx, q, "detail")
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `
		SELECT id, at, event, coalesce(work_id, 0), coalesce(destination, ''), `+texts+`
		FROM mefor_event WHERE message_id = $1
		ORDER BY id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("read events of message %d: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.At, &e.Event, &e.WorkID, &e.Destination, &e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read events of message %d: %w", messageID, err)
	}
	return out, nil
}

// DeadRow is one dead-lettered stage row.
type DeadRow struct {
	WorkID      int64     `json:"work_id"`
	MessageID   int64     `json:"message_id"`
	Channel     string    `json:"channel"`
	Stage       string    `json:"stage"`
	Lane        string    `json:"lane"`
	Destination string    `json:"destination,omitempty"`
	Handler     string    `json:"handler,omitempty"`
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error,omitempty"`
	DeadAt      time.Time `json:"dead_at"`
	ControlID   string    `json:"control_id,omitempty"`
	MessageType string    `json:"message_type,omitempty"`
}

// ListDead returns dead rows of every stage, most recently dead first.
// scope, when not empty, keeps only the rows of messages of channels
// matching one of its patterns (as MessageFilter.Scope), in the query.
func ListDead(ctx context.Context, q pipeline.DBTX, f pipeline.DeadFilter, scope []string) ([]DeadRow, error) {
	res, err := ChannelRegexps(scope)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	texts, err := textColumn(ctx, q, "w.last_error")
	if err != nil {
		return nil, err
	}
	return dbpool.Rows(ctx, q, "list dead letters", func(r pgx.CollectableRow) (DeadRow, error) {
		var d DeadRow
		err := r.Scan(&d.WorkID, &d.MessageID, &d.Channel, &d.Stage, &d.Lane, &d.Destination,
			&d.Handler, &d.Attempts, &d.LastError, &d.DeadAt, &d.ControlID, &d.MessageType)
		return d, err
	}, `
		SELECT w.id, w.message_id, w.channel, w.stage, w.lane, coalesce(w.destination, ''),
			coalesce(w.handler, ''), w.attempts, `+texts+`,
			coalesce(w.finished_at, w.updated_at),
			coalesce(m.control_id, ''),
			coalesce(m.message_type || coalesce('^' || m.trigger_event, ''), '')
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.status = 'dead'
		  AND ($1 = '' OR w.channel = $1) AND ($2 = '' OR w.destination = $2)
		  AND (cardinality($4::text[]) = 0 OR m.channel ~ ANY($4))
		ORDER BY coalesce(w.finished_at, w.updated_at) DESC, w.id DESC
		LIMIT $3`, f.Channel, f.Destination, limitOf(f.Limit), res)
}

// ChannelStatus is one channel's line of `mefor status`.
type ChannelStatus struct {
	Channel string `json:"channel"`
	// Received is every message the channel has stored (retention deletes
	// none: it purges bodies and keeps the rows).
	Received int64            `json:"received"`
	ByStatus map[string]int64 `json:"by_status"`
	// Queued counts pending ingress and routed rows: work not yet handed to
	// a destination.
	Queued int64 `json:"queued"`
	// OldestQueuedSeconds is the age of the oldest queued row, by the
	// database clock; nil when nothing is queued.
	OldestQueuedSeconds *float64 `json:"oldest_queued_seconds"`
}

// DestinationStatus is one destination's line of `mefor status`.
type DestinationStatus struct {
	Destination string `json:"destination"`
	// Lanes is how many lanes of the destination have carried work.
	Lanes int `json:"lanes"`
	// Queued counts pending rows, including those in flight.
	Queued int64 `json:"queued"`
	// InFlight counts lanes whose drainer job is running and whose head row
	// is due: each such head is being sent (or about to be) right now.
	InFlight            int64    `json:"in_flight"`
	Delivered           int64    `json:"delivered"`
	Dead                int64    `json:"dead"`
	Cancelled           int64    `json:"cancelled"`
	OldestQueuedSeconds *float64 `json:"oldest_queued_seconds"`
}

// Status is the whole `mefor status` answer.
type Status struct {
	At           time.Time           `json:"at"`
	Channels     []ChannelStatus     `json:"channels"`
	Destinations []DestinationStatus `json:"destinations"`
	// Config is the cluster config version and each node's applied config
	// (filled by ops.Status, not ReadStatus).
	Config *leader.ConfigStatus `json:"config,omitempty"`
	// Cluster is the listener lease, River's leader and the node counts
	// (filled by ops.Status, not ReadStatus).
	Cluster *leader.ClusterStatus `json:"cluster,omitempty"`
	// Retention is the oldest message body still kept (filled by
	// ops.Status).
	Retention *retention.Status `json:"retention,omitempty"`
	// Transport is the certificates and listeners the live nodes recorded
	// (filled by ops.Status).
	Transport *nodeinfo.TransportStatus `json:"transport,omitempty"`
	// Encryption is what the live nodes seal content with (filled by
	// ops.Status).
	Encryption *nodeinfo.EncryptionStatus `json:"encryption,omitempty"`
	// Egress is where the live nodes let data go (filled by ops.Status).
	Egress *nodeinfo.EgressStatus `json:"egress,omitempty"`
	// AuditForward is how far each audit.forward target has had the
	// audit trail accepted (filled by ops.Status).
	AuditForward []auditforward.Status `json:"audit_forward,omitempty"`
}

// ReadStatus computes the per-channel and per-destination counts. Run it in a
// repeatable-read transaction for numbers that agree with each other. It
// sums the summary counts (counts.go) and reads the oldest pending row of
// each group from an index, so it costs in proportion to the channels,
// destinations and lanes, not to the messages kept or queued.
func ReadStatus(ctx context.Context, q pipeline.DBTX) (*Status, error) {
	st := &Status{Channels: []ChannelStatus{}, Destinations: []DestinationStatus{}}
	if err := q.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&st.At); err != nil {
		return nil, fmt.Errorf("read status: %w", err)
	}

	chIdx := map[string]int{}
	channel := func(name string) *ChannelStatus {
		i, ok := chIdx[name]
		if !ok {
			i = len(st.Channels)
			chIdx[name] = i
			st.Channels = append(st.Channels, ChannelStatus{Channel: name, ByStatus: map[string]int64{}})
		}
		return &st.Channels[i]
	}

	rows, err := q.Query(ctx, messageCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	var name, status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &status, &n}, func() error {
		c := channel(name)
		c.Received += n
		c.ByStatus[status] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}

	groups, err := readPendingGroups(ctx, q)
	if err != nil {
		return nil, err
	}
	// Queued work of a channel is its pending ingress and routed rows; the
	// oldest is the oldest of either stage. Channels are taken in name
	// order, as the listing of messages above is.
	type queued struct {
		n   int64
		age float64
	}
	byChannel := map[string]*queued{}
	destAge := map[string]float64{}
	for _, g := range groups {
		if g.Stage == jobs.StageOutbound {
			if a, ok := destAge[g.Destination]; !ok || g.OldestSeconds > a {
				destAge[g.Destination] = g.OldestSeconds
			}
			continue
		}
		c := byChannel[g.Channel]
		if c == nil {
			c = &queued{age: g.OldestSeconds}
			byChannel[g.Channel] = c
		}
		c.n += g.Pending
		c.age = max(c.age, g.OldestSeconds)
	}
	for _, name := range slices.Sorted(maps.Keys(byChannel)) {
		c := channel(name)
		c.Queued = byChannel[name].n
		a := byChannel[name].age
		c.OldestQueuedSeconds = &a
	}

	rows, err = q.Query(ctx, deliveryCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}
	dIdx := map[string]int{}
	var d DestinationStatus
	_, err = pgx.ForEachRow(rows, []any{&d.Destination, &d.Lanes, &d.Queued, &d.Delivered, &d.Dead, &d.Cancelled},
		func() error {
			d.OldestQueuedSeconds = nil
			if a, ok := destAge[d.Destination]; ok {
				d.OldestQueuedSeconds = &a
			}
			dIdx[d.Destination] = len(st.Destinations)
			st.Destinations = append(st.Destinations, d)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}

	inFlight, err := jobs.InFlightDeliveries(ctx, q)
	if err != nil {
		return nil, err
	}
	for name, n := range inFlight {
		if i, ok := dIdx[name]; ok {
			st.Destinations[i].InFlight = n
		}
	}
	return st, nil
}

func limitOf(n int) int {
	if n <= 0 {
		return DefaultListLimit
	}
	return n
}

// textColumn is the select expression of an error or event text column:
// the column when the session's role may read the texts, else an empty
// text. Readers may not (the texts can quote the message; see
// readerHiddenColumns in migrations), and a query naming the column at all
// would be refused whole.
func textColumn(ctx context.Context, q pipeline.DBTX, col string) (string, error) {
	var ok bool
	err := q.QueryRow(ctx, `
		SELECT has_column_privilege('mefor_message', 'error', 'SELECT')
		   AND has_column_privilege('mefor_work', 'last_error', 'SELECT')
		   AND has_column_privilege('mefor_event', 'detail', 'SELECT')`).Scan(&ok)
	if err != nil {
		return "", fmt.Errorf("check which texts this role may read: %w", err)
	}
	if !ok {
		return "''::text", nil
	}
	return "coalesce(" + col + ", '')", nil
}
