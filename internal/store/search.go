package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// MessageFilter narrows ListMessages. Empty fields do not filter; the
// filters given all apply. Every filter but Text is answered from an index.
type MessageFilter struct {
	Channel string
	Status  string
	// ControlID is MSH-10, exactly.
	ControlID string
	// Patient is a patient identifier as PID-3.1 holds it, exactly; it is
	// looked up as PatientKey(Patient).
	Patient string
	// Type is the HL7 type: "ADT" (any trigger) or "ADT^A08"; a third
	// component (the structure, ADT_A01) is ignored.
	Type string
	// Since and Until bound the time of receipt: Since <= received_at <
	// Until. Zero means unbounded.
	Since, Until time.Time
	// Destination keeps messages with a stage row for this destination
	// (queued, delivered, dead or cancelled).
	Destination string
	// Text keeps messages whose stored body contains it, byte for byte
	// (case-sensitive). It reads the bodies of every message the other
	// filters leave: slow on a large store, so narrow it with them.
	Text  string
	Limit int // <= 0: DefaultListLimit
}

// SplitType splits an HL7 type such as "ADT^A08^ADT_A01" into its message
// type and trigger event.
func SplitType(t string) (messageType, triggerEvent string) {
	parts := strings.Split(t, "^")
	messageType = parts[0]
	if len(parts) > 1 {
		triggerEvent = parts[1]
	}
	return messageType, triggerEvent
}

// ListMessages returns the messages matching f, newest first.
func ListMessages(ctx context.Context, q DBTX, f MessageFilter) ([]MessageSummary, error) {
	sql, args := listMessagesSQL(f)
	rows, err := q.Query(ctx, sql, args)
	if err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageSummary, error) {
		var m MessageSummary
		err := r.Scan(&m.ID, &m.ReceivedAt, &m.Channel, &m.MessageType, &m.TriggerEvent,
			&m.ControlID, &m.Status, &m.Size)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	return out, nil
}

// listMessagesSQL writes the query for f with only the filters it uses, so
// the planner sees plain equalities and ranges and picks the index for
// each: one catch-all statement ("$1 is empty or col = $1") would hide
// them from it.
func listMessagesSQL(f MessageFilter) (string, pgx.NamedArgs) {
	var where []string
	args := pgx.NamedArgs{"limit": limitOf(f.Limit)}
	eq := func(col, name, v string) {
		if v != "" {
			where = append(where, fmt.Sprintf("m.%s = @%s", col, name))
			args[name] = v
		}
	}
	eq("channel", "channel", f.Channel)
	eq("status", "status", f.Status)
	eq("control_id", "control_id", f.ControlID)
	if f.Patient != "" {
		eq("patient_key", "patient", PatientKey(f.Patient))
	}
	if f.Type != "" {
		typ, trigger := SplitType(f.Type)
		eq("message_type", "message_type", typ)
		eq("trigger_event", "trigger_event", trigger)
	}
	if !f.Since.IsZero() {
		where = append(where, "m.received_at >= @since")
		args["since"] = f.Since
	}
	if !f.Until.IsZero() {
		where = append(where, "m.received_at < @until")
		args["until"] = f.Until
	}
	if f.Destination != "" {
		where = append(where, "EXISTS (SELECT 1 FROM mefor_work w WHERE w.destination = @destination AND w.message_id = m.id)")
		args["destination"] = f.Destination
	}
	if f.Text != "" {
		where = append(where, "position(@text::bytea IN m.raw) > 0")
		args["text"] = []byte(f.Text)
	}
	sql := `
		SELECT m.id, m.received_at, m.channel, coalesce(m.message_type, ''), coalesce(m.trigger_event, ''),
			coalesce(m.control_id, ''), m.status, m.size
		FROM mefor_message m`
	if len(where) > 0 {
		sql += "\n\t\tWHERE " + strings.Join(where, "\n\t\t  AND ")
	}
	// Newest first is id order, which the primary key gives for free. With
	// an upper time bound it is receipt order instead (the two agree but
	// for transactions committed out of order): walking the id index back
	// from the newest message would pass every message after the bound
	// before the first match, while the received_at index starts at it.
	order := "m.id DESC"
	if !f.Until.IsZero() {
		order = "m.received_at DESC, m.id DESC"
	}
	return sql + "\n\t\tORDER BY " + order + "\n\t\tLIMIT @limit", args
}

// ListMessagesSQL is the statement ListMessages runs for f, for EXPLAIN in
// benchmarks.
func ListMessagesSQL(f MessageFilter) (string, pgx.NamedArgs) { return listMessagesSQL(f) }
