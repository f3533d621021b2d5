package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/leader"
)

// Reads is what the read endpoints call: the functions of package ops the
// CLI's status, nodes, alerts list and messages commands call, over the
// node's pool (ops.APIReads). It is given to the server rather than
// imported because ops imports the engine that serves this API.
type Reads interface {
	Status(ctx context.Context) (*search.Status, error)
	Nodes(ctx context.Context) ([]leader.Node, error)
	Alerts(ctx context.Context) ([]alert.Alert, error)
	// Messages lists messages; f.Scope is applied in its query.
	Messages(ctx context.Context, f search.MessageFilter) ([]search.MessageSummary, error)
	// Message reads one message, its bodies too when withBody, as someone
	// who sees only the channels sees accepts: another channel's message
	// is pipeline.ErrNotFound.
	Message(ctx context.Context, id int64, withBody bool, sees func(channel string) bool) (*search.MessageView, error)
	// Dead lists dead letters of the channels scope matches (all when
	// empty), scoped in its query.
	Dead(ctx context.Context, f pipeline.DeadFilter, scope []string) ([]search.DeadRow, error)
	Audit(ctx context.Context, f audit.Filter) ([]audit.Record, error)
}

// maxListLimit bounds a listing's limit.
const maxListLimit = 1000

// notFound is the one answer for a message that does not exist and for
// one out of the caller's scope: the two must not be told apart.
var notFound = apiError{Error: "no such message"}

func (s *Server) readRoutes(mux *http.ServeMux) {
	if s.reads == nil {
		return
	}
	mux.HandleFunc("GET /api/v1/status", s.authed(s.status))
	mux.HandleFunc("GET /api/v1/nodes", s.authed(s.nodes))
	mux.HandleFunc("GET /api/v1/alerts", s.authed(s.alerts))
	mux.HandleFunc("GET /api/v1/messages", s.authed(s.messages))
	mux.HandleFunc("POST /api/v1/messages/search", s.authed(s.searchMessages))
	mux.HandleFunc("GET /api/v1/messages/{id}", s.authed(s.message))
	mux.HandleFunc("GET /api/v1/messages/{id}/body", s.authed(s.messageBody))
	mux.HandleFunc("GET /api/v1/dead", s.authed(s.dead))
	mux.HandleFunc("GET /api/v1/audit", s.authed(s.auditLog))
}

// failed answers 500 for an error the caller cannot act on, logging it
// (errors carry ids, never content).
func (s *Server) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.logger.ErrorContext(r.Context(), "api read failed", "read", what, "err", err)
	writeError(w, http.StatusInternalServerError, apiError{Error: what + " failed; see the node's log"})
}

// actorCtx names the person, their address and session or token in
// every audit row the request's reads append.
func actorCtx(r *http.Request, req request) context.Context {
	return audit.WithOrigin(r.Context(), origin(r, req))
}

func (s *Server) status(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermStatus) {
		return
	}
	st, err := s.reads.Status(r.Context())
	if err != nil {
		s.failed(w, r, "status", err)
		return
	}
	scopeStatus(st, req.principal)
	writeJSON(w, http.StatusOK, st)
}

// scopeStatus leaves out of st what a scoped principal may not see: other
// channels' rows and listeners. Destinations carry several channels'
// deliveries mixed, so a scoped principal sees none of their rows.
func scopeStatus(st *search.Status, p *identity.Principal) {
	if len(p.Channels) == 0 {
		return
	}
	channels := st.Channels[:0]
	for _, c := range st.Channels {
		if p.SeesChannel(c.Channel) {
			channels = append(channels, c)
		}
	}
	st.Channels = channels
	st.Destinations = []search.DestinationStatus{}
	if st.Transport != nil {
		listeners := []nodeinfo.ListenerInUse{}
		for _, l := range st.Transport.Listeners {
			if p.SeesChannel(l.Channel) {
				listeners = append(listeners, l)
			}
		}
		st.Transport.Listeners = listeners
	}
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermNodes) {
		return
	}
	list, err := s.reads.Nodes(r.Context())
	if err != nil {
		s.failed(w, r, "the node list", err)
		return
	}
	if list == nil {
		list = []leader.Node{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"nodes": list})
}

func (s *Server) alerts(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermAlertsRead) {
		return
	}
	list, err := s.reads.Alerts(r.Context())
	if err != nil {
		s.failed(w, r, "the alert list", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"alerts": s.scopeAlerts(list, req.principal)})
}

// scopeAlerts leaves out of list what a scoped principal may not see: the
// alerts of rules on other channels, and (as in the status) those on
// destinations, which carry several channels' deliveries mixed, and on
// the audit trail. An unknown rule (added by a reload since) is left out.
func (s *Server) scopeAlerts(list []alert.Alert, p *identity.Principal) []alert.Alert {
	out := []alert.Alert{}
	for _, a := range list {
		if len(p.Channels) > 0 {
			if s.alertChannel == nil {
				continue
			}
			if ch, known := s.alertChannel(a.Rule); !known || ch == "" || !p.SeesChannel(ch) {
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

// listQuery is a listing's filters, from the query string or a search's
// body.
type listQuery struct {
	Channel     string `json:"channel"`
	Destination string `json:"destination"`
	Status      string `json:"status"`
	ControlID   string `json:"control_id"`
	Patient     string `json:"patient"`
	// Text is a text the message's body contains (a search's body only:
	// it is content).
	Text   string `json:"text"`
	Type   string `json:"type"`
	Since  string `json:"since"`
	Until  string `json:"until"`
	Limit  int    `json:"limit"`
	Cursor string `json:"cursor"`
}

// listParams are the query parameters GET /api/v1/messages takes.
var listParams = map[string]bool{"channel": true, "destination": true, "status": true, "control_id": true,
	"type": true, "since": true, "until": true, "limit": true, "cursor": true}

// queryOf reads a listing's query string. A patient identifier is refused
// there: URLs are kept in logs, proxies and browser history, so a patient
// search goes in a POST body (POST /api/v1/messages/search).
func queryOf(v url.Values) (listQuery, *apiError) {
	for k := range v {
		if k == "patient" || k == "text" {
			return listQuery{}, &apiError{Error: "a " + k + " to search for never goes in a URL; POST it as {\"" + k + "\": ...} to /api/v1/messages/search",
				Field: k}
		}
		if !listParams[k] {
			return listQuery{}, &apiError{Error: "unknown query parameter " + k, Field: k}
		}
	}
	q := listQuery{Channel: v.Get("channel"), Destination: v.Get("destination"), Status: v.Get("status"),
		ControlID: v.Get("control_id"), Type: v.Get("type"), Since: v.Get("since"), Until: v.Get("until"), Cursor: v.Get("cursor")}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			return listQuery{}, &apiError{Error: "limit is a number of messages", Field: "limit"}
		}
		q.Limit = n
	}
	return q, nil
}

// when reads a time bound: RFC 3339 or a date (midnight UTC).
func when(field, s string) (time.Time, *apiError) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, &apiError{Error: field + " is RFC 3339 (2024-05-01T08:00:00Z) or a date (2024-05-01)", Field: field}
}

// filter turns q into the search filter, scoped to p's channels.
func (q listQuery) filter(p *identity.Principal) (search.MessageFilter, *apiError) {
	f := search.MessageFilter{Channel: q.Channel, Destination: q.Destination, Status: q.Status, ControlID: q.ControlID,
		Patient: q.Patient, Text: q.Text, Type: q.Type, Limit: q.Limit, Scope: p.Channels}
	var e *apiError
	if f.Since, e = when("since", q.Since); e != nil {
		return f, e
	}
	if f.Until, e = when("until", q.Until); e != nil {
		return f, e
	}
	switch {
	case q.Limit < 0 || q.Limit > maxListLimit:
		return f, &apiError{Error: fmt.Sprintf("limit is 1 to %d (0 for the default, %d)", maxListLimit, search.DefaultListLimit), Field: "limit"}
	case q.Limit == 0:
		f.Limit = search.DefaultListLimit
	}
	if q.Cursor != "" {
		c, err := decodeCursor(q.Cursor)
		if err != nil {
			return f, &apiError{Error: "cursor is the next of a previous answer", Field: "cursor"}
		}
		f.After = &c
	}
	return f, nil
}

// A cursor is the last message of a page, its id and time of receipt, in
// URL-safe base64: it holds no content.
func encodeCursor(m search.MessageSummary) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(m.ID, 10) + "." + strconv.FormatInt(m.ReceivedAt.UnixNano(), 10)))
}

func decodeCursor(s string) (search.Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return search.Cursor{}, err
	}
	id, at, ok := strings.Cut(string(b), ".")
	if !ok {
		return search.Cursor{}, errors.New("no separator")
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return search.Cursor{}, err
	}
	ns, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return search.Cursor{}, err
	}
	return search.Cursor{ID: n, ReceivedAt: time.Unix(0, ns).UTC()}, nil
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermMessagesRead) {
		return
	}
	q, e := queryOf(r.URL.Query())
	if e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	s.list(w, r, req, q)
}

// searchMessages is a listing whose filters come in the body, the one way
// to search by patient. A patient search tells where a patient was
// treated, so it needs the content permission and is audited, naming the
// person (ops.ListMessages).
func (s *Server) searchMessages(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermMessagesRead) {
		return
	}
	var q listQuery
	if e := decode(r, &q); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	if (q.Patient != "" || q.Text != "") && !require(w, req, identity.PermMessagesBody) {
		return
	}
	s.list(w, r, req, q)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, req request, q listQuery) {
	f, e := q.filter(req.principal)
	if e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	list, err := s.reads.Messages(actorCtx(r, req), f)
	if errors.Is(err, search.ErrPatientSearchNeedsKeys) {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "patient search needs the nodes to run with encryption keys: " +
			"without them no patient is indexed", Field: "patient"})
		return
	}
	if err != nil {
		s.failed(w, r, "the message list", err)
		return
	}
	var next *string
	if len(list) == f.Limit {
		c := encodeCursor(list[len(list)-1])
		next = &c
	}
	if list == nil {
		list = []search.MessageSummary{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": list, "next": next})
}

// messageID reads the path's id; an id that is no number is a 404 like
// any other message not found.
func messageID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id, err == nil && id > 0
}

func (s *Server) message(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermMessagesRead) {
		return
	}
	s.show(w, r, req, false)
}

func (s *Server) messageBody(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermMessagesBody) {
		return
	}
	s.show(w, r, req, true)
}

// bodyView is a message's content as GET /api/v1/messages/{id}/body
// answers it: the message as received, each partner reply and each
// delivery's payload as sent, as text.
type bodyView struct {
	MessageID int64          `json:"message_id"`
	Raw       *string        `json:"raw"`
	Replies   []replyBody    `json:"replies"`
	Outbound  []outboundBody `json:"outbound"`
}

// replyBody is a partner's reply; Body is null when the partner sent none
// or retention purged it.
type replyBody struct {
	ID     int64   `json:"id"`
	WorkID int64   `json:"work_id"`
	Body   *string `json:"body"`
}

// outboundBody is a delivery's payload; null once retention purged it.
type outboundBody struct {
	WorkID      int64   `json:"work_id"`
	Destination string  `json:"destination"`
	Payload     *string `json:"payload"`
}

// text is b as a JSON string, nil for none.
func text(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func (s *Server) show(w http.ResponseWriter, r *http.Request, req request, withBody bool) {
	id, ok := messageID(r)
	if !ok {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	v, err := s.reads.Message(actorCtx(r, req), id, withBody, req.principal.SeesChannel)
	if errors.Is(err, pipeline.ErrNotFound) {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	if err != nil {
		s.failed(w, r, "the message", err)
		return
	}
	if !withBody {
		writeJSON(w, http.StatusOK, v)
		return
	}
	b := bodyView{MessageID: v.Message.ID, Replies: []replyBody{}, Outbound: []outboundBody{}}
	if v.Message.Raw != nil {
		raw := string(v.Message.Raw)
		b.Raw = &raw
	}
	for _, rp := range v.Replies {
		b.Replies = append(b.Replies, replyBody{ID: rp.ID, WorkID: rp.WorkID, Body: text(rp.Body)})
	}
	for _, o := range v.Outbound {
		b.Outbound = append(b.Outbound, outboundBody{WorkID: o.WorkID, Destination: o.Destination, Payload: text(o.Payload)})
	}
	writeJSON(w, http.StatusOK, b)
}
