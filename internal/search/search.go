package search

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
)

// ErrPatientSearchNeedsKeys is a search by patient without encryption keys:
// patients are indexed only by a keyed blind index (never the identifier
// in clear), so without the keys there is nothing to search by. It is
// defined here, with the search, for both ops and the API to name.
var ErrPatientSearchNeedsKeys = errors.New("patient search needs encryption keys: patients are indexed only under a key " +
	"(a blind index, never the identifier in clear); set " + crypt.EnvKeys + " for this command, as on the nodes")

// MessageFilter narrows ListMessages. Empty fields do not filter; the
// filters given all apply. Every filter but Text is answered from an index.
type MessageFilter struct {
	Channel string
	Status  string
	// ControlID is MSH-10, exactly.
	ControlID string
	// Patient is a patient identifier as PID-3.1 holds it, exactly; it is
	// looked up as pipeline.PatientKeys(Keys, Patient).
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
	Limit int // Defaults to DefaultListLimit (50) when not positive.
	// Scope keeps only messages of channels matching one of these
	// patterns (path.Match's syntax, a user's channel scope), in the query
	// itself. Defaults to every channel when empty.
	Scope []string
	// After continues a listing after the last message of a page before
	// it, in the listing's order. Defaults to the start.
	After *Cursor

	// Keys blinds Patient and opens the bodies Text reads; nil matches
	// them in clear (encryption off). A sealed body without its key is an
	// error, never a silent miss.
	Keys *crypt.Keyring
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
func ListMessages(ctx context.Context, q pipeline.DBTX, f MessageFilter) ([]MessageSummary, error) {
	if _, err := ChannelRegexps(f.Scope); err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	if f.Text != "" {
		return searchText(ctx, q, f)
	}
	sql, args := listMessagesSQL(f)
	return dbpool.Rows(ctx, q, "list messages", func(r pgx.CollectableRow) (MessageSummary, error) {
		var m MessageSummary
		err := r.Scan(&m.ID, &m.ReceivedAt, &m.Channel, &m.MessageType, &m.TriggerEvent,
			&m.ControlID, &m.Status, &m.Size, &m.CutAt)
		return m, err
	}, sql, args)
}

// textPage is how many candidate messages searchText looks at per page.
const textPage = 500

// beginner starts a transaction: a pool (a transaction's Begin would make
// a savepoint, holding every page's audit row lock until its commit).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// searchText answers a filter with Text, page by page in the listing's
// order, each page its own short transaction: the other filters pick a
// page of candidates by their metadata, and mefor_search_bodies (migration
// 022) returns those whose body holds the text in clear and every sealed
// one, appending a search-bodies audit row naming them; sealed ones are
// opened and matched here. Operators hold no SELECT on the bodies, so this
// is the only way a search reads them. q must be a pool.
func searchText(ctx context.Context, q pipeline.DBTX, f MessageFilter) ([]MessageSummary, error) {
	db, ok := q.(beginner)
	if !ok {
		return nil, fmt.Errorf("search the bodies: needs a pool to run its pages on, not %T", q)
	}
	limit := limitOf(f.Limit)
	meta := f
	meta.Text = ""
	osUser, host := audit.Who()
	target, err := json.Marshal(map[string]any{"channel": f.Channel, "destination": f.Destination,
		"text_bytes": len(f.Text), "by_patient": f.Patient != ""})
	if err != nil {
		return nil, fmt.Errorf("search the bodies: %w", err)
	}
	var out []MessageSummary
	var after *MessageSummary
	for {
		sql, args := listMessagesSQL(meta)
		args["limit"] = textPage
		if after != nil {
			args["after_id"], args["after_at"] = after.ID, after.ReceivedAt
		}
		var page []MessageSummary
		bodies := map[int64][]byte{}
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, textPageSQL(sql, f, after != nil), args)
			if err != nil {
				return err
			}
			page, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageSummary, error) {
				var m MessageSummary
				err := r.Scan(&m.ID, &m.ReceivedAt, &m.Channel, &m.MessageType, &m.TriggerEvent,
					&m.ControlID, &m.Status, &m.Size, &m.CutAt)
				return m, err
			})
			if err != nil || len(page) == 0 {
				return err
			}
			ids := make([]int64, len(page))
			for i, m := range page {
				ids[i] = m.ID
			}
			rows, err = tx.Query(ctx, `SELECT message_id, raw FROM mefor_search_bodies($1, $2, $3, $4, $5)`,
				ids, []byte(f.Text), osUser, host, string(target))
			if err != nil {
				return err
			}
			var id int64
			var raw []byte
			_, err = pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
				bodies[id] = raw
				raw = nil
				return nil
			})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("search the bodies: %w", err)
		}
		for _, m := range page {
			raw, ok := bodies[m.ID]
			if !ok {
				continue
			}
			body, err := f.Keys.Open(pipeline.ColRaw, pipeline.MessageRow(m.ID), raw)
			if err != nil {
				return nil, fmt.Errorf("search the body of message %d: %w", m.ID, err)
			}
			if bytes.Contains(body, []byte(f.Text)) {
				out = append(out, m)
				if len(out) == limit {
					return out, nil
				}
			}
		}
		if len(page) < textPage {
			return out, nil
		}
		after = &page[len(page)-1]
	}
}

// textPageSQL turns the listing's statement into one page of searchText:
// it continues after the last row of the previous page in the listing's
// order.
func textPageSQL(sql string, f MessageFilter, next bool) string {
	if next {
		cond := "m.id < @after_id"
		if !f.Until.IsZero() {
			cond = "(m.received_at, m.id) < (@after_at, @after_id)"
		}
		if strings.Contains(sql, "\n\t\tWHERE ") {
			sql = strings.Replace(sql, "\n\t\tWHERE ", "\n\t\tWHERE "+cond+"\n\t\t  AND ", 1)
		} else {
			sql = strings.Replace(sql, "\n\t\tORDER BY ", "\n\t\tWHERE "+cond+"\n\t\tORDER BY ", 1)
		}
	}
	return sql
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
		where = append(where, "m.patient_key = ANY(@patient)")
		args["patient"] = pipeline.PatientKeys(f.Keys, f.Patient)
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
	if len(f.Scope) > 0 {
		// A scope that does not translate matches nothing (ListMessages
		// refuses it first): failing closed, never listing every channel.
		if res, err := ChannelRegexps(f.Scope); err != nil {
			where = append(where, "false")
		} else {
			where = append(where, "m.channel ~ ANY(@scope)")
			args["scope"] = res
		}
	}
	if f.After != nil {
		if f.Until.IsZero() {
			where = append(where, "m.id < @cursor_id")
		} else {
			where = append(where, "(m.received_at, m.id) < (@cursor_at, @cursor_id)")
			args["cursor_at"] = f.After.ReceivedAt
		}
		args["cursor_id"] = f.After.ID
	}
	sql := `
		SELECT m.id, m.received_at, m.channel, coalesce(m.message_type, ''), coalesce(m.trigger_event, ''),
			coalesce(m.control_id, ''), m.status, m.size, coalesce(m.cut_at, 0)
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
