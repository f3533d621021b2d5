package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
)

// Scope is which channels an action may touch: nil touches every channel.
type Scope func(channel string) bool

// Actions is what the action endpoints call: the functions of package ops
// the CLI's replay, replay-dead, cancel and stepdown call, over the node's
// pool (ops.APIActions). Their answers are encoded as the CLI's --json
// prints them. Each appends its audit rows with the origin the request's
// ctx carries (audit.WithOrigin).
type Actions interface {
	// MessageChannel is the channel of message id, pipeline.ErrNotFound
	// when there is none.
	MessageChannel(ctx context.Context, id int64) (string, error)
	// Replay re-queues one message (ops.Replay).
	Replay(ctx context.Context, id int64) (any, error)
	// ReplayDead re-queues the dead letters of destination and channel
	// (empty: all) of the channels scope holds (ops.ReplayDead), once per
	// channel when scope is set.
	ReplayDead(ctx context.Context, channel, destination string, scope Scope) (any, error)
	// Cancel cancels pending deliveries of destination, of channel (empty:
	// all) and of the channels scope holds (ops.Cancel), once per channel
	// when scope is set.
	// wait bounds how long it waits for rows a drainer may be sending
	// (0: the node's default).
	Cancel(ctx context.Context, destination, channel string, top bool, wait time.Duration, scope Scope) (any, error)
	// Stepdown asks node ("" : the lease holder) to release the listener
	// lease and waits for its answer (ops.RequestStepdown).
	// timeout bounds the wait for the node's answer (0: the node's
	// default).
	Stepdown(ctx context.Context, node string, timeout time.Duration) (any, error)
	// RotateKeys re-seals every value not under the node's active key
	// under it (ops.RotateKeys with the node's keyring); ErrNoKeys when
	// the node runs without encryption keys.
	RotateKeys(ctx context.Context) (any, error)
}

// ErrNoKeys is a key rotation asked of a node without encryption keys.
var ErrNoKeys = errors.New("this node runs without encryption keys (MEFOR_ENCRYPTION_KEYS): there is no active key to rotate to")

// Approvals is dual control (access.approvals): the actions whose
// permission RequiredFor names wait for a second person.
type Approvals struct {
	// Store keeps the requests. Defaults to none: every action runs when
	// asked, and the approvals endpoints answer 404.
	Store *approval.Store
	// RequiredFor lists the permissions whose actions need an approval.
	// Defaults to none.
	RequiredFor []identity.Permission
}

// actionParams is what an action acts on, as a request stores it.
type actionParams struct {
	MessageID   int64  `json:"message_id,omitempty"`
	Channel     string `json:"channel,omitempty"`
	Destination string `json:"destination,omitempty"`
	Top         bool   `json:"top,omitempty"`
	Node        string `json:"node,omitempty"`
	// WaitMS is a cancel's wait or a stepdown's timeout, in milliseconds
	// (0: the node's default).
	WaitMS int64 `json:"wait_ms,omitempty"`
}

// MaxActionWait bounds the wait a cancel or a stepdown may ask for: the
// answer must come well within the server's write timeout.
const MaxActionWait = 45 * time.Second

// actionWait reads an optional wait (a Go duration such as 30s) of a request
// body's field, at most MaxActionWait.
func actionWait(field, s string) (time.Duration, *apiError) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxActionWait {
		return 0, &apiError{Error: fmt.Sprintf("%s must be a duration from 0s to %s (e.g. 30s)", field, MaxActionWait), Field: field}
	}
	if d == 0 {
		// 0s asks not to wait; a millisecond keeps it apart from no
		// value, which is the node's default.
		d = time.Millisecond
	}
	return d, nil
}

func (s *Server) actionRoutes(mux *http.ServeMux) {
	if s.actions == nil {
		return
	}
	mux.HandleFunc("POST /api/v1/messages/{id}/replay", s.authed(s.replay))
	mux.HandleFunc("POST /api/v1/dead/replay", s.authed(s.action(identity.PermReplayDead, replayDeadParams)))
	mux.HandleFunc("POST /api/v1/destinations/{name}/cancel", s.authed(s.action(identity.PermCancel, cancelParams)))
	mux.HandleFunc("POST /api/v1/cluster/stepdown", s.authed(s.action(identity.PermStepdown, stepdownParams)))
	mux.HandleFunc("POST /api/v1/keys/rotate", s.authed(s.action(identity.PermKeysRotate, rotateKeysParams)))
	mux.HandleFunc("POST /api/v1/reauth", s.authed(s.reauth))
	if s.approvals.Store != nil {
		mux.HandleFunc("GET /api/v1/approvals", s.authed(s.listApprovals))
		mux.HandleFunc("POST /api/v1/approvals/{id}/approve", s.authed(s.decideApproval(true)))
		mux.HandleFunc("POST /api/v1/approvals/{id}/reject", s.authed(s.decideApproval(false)))
	}
}

// origin is the request's person and how they came, for the audit rows
// its reads and actions append.
func origin(r *http.Request, req request) audit.Origin {
	return audit.Origin{Actor: req.principal.Name, Source: source(r), SessionID: req.principal.SessionID, TokenID: req.principal.TokenID}
}

// scopeOf is the principal's scope, nil when it sees every channel.
func scopeOf(p *identity.Principal) Scope {
	if len(p.Channels) == 0 {
		return nil
	}
	return p.SeesChannel
}

// reauthed answers 403 naming "reauth" when perm's actions need a fresh
// re-authentication (identity.NeedsReauth) and the request has none. An
// API token has no session to re-authenticate, so it never has one.
func (s *Server) reauthed(w http.ResponseWriter, r *http.Request, req request, perm identity.Permission) bool {
	if !identity.NeedsReauth(perm) {
		return true
	}
	p := req.principal
	if p.SessionID == 0 {
		writeError(w, http.StatusForbidden, apiError{Error: string(perm) + " needs a re-authentication within the last 5 minutes, which an API token " +
			"cannot give: log in, then POST /api/v1/reauth {password, totp}", Permission: "reauth"})
		return false
	}
	fresh, err := s.store.ReauthFresh(r.Context(), p.SessionID)
	if err != nil {
		s.failed(w, r, "the re-authentication check", err)
		return false
	}
	if !fresh {
		writeError(w, http.StatusForbidden, apiError{Error: string(perm) + " needs a re-authentication within the last 5 minutes: " +
			"POST /api/v1/reauth {password, totp} (or, signed in through SSO, GET /api/v1/sso/reauth), then ask again", Permission: "reauth"})
		return false
	}
	return true
}

// needsApproval reports whether perm's actions wait for a second person.
func (s *Server) needsApproval(perm identity.Permission) bool {
	return s.approvals.Store != nil && slices.Contains(s.approvals.RequiredFor, perm)
}

// act runs an action the request asked for, after its permission and
// re-authentication were checked: at once, or, when access.approvals
// names it, as a pending request answered 202 with its approval_id.
func (s *Server) act(w http.ResponseWriter, r *http.Request, req request, perm identity.Permission, params actionParams) {
	ctx := audit.WithOrigin(r.Context(), origin(r, req))
	if !s.needsApproval(perm) {
		res, err := s.run(ctx, perm, params, scopeOf(req.principal))
		s.answer(w, r, string(perm), res, err)
		return
	}
	a, err := s.approvals.Store.Request(ctx, string(perm), params,
		approval.Person{Name: req.principal.Name, Channels: req.principal.Channels, Source: source(r)})
	if err != nil {
		s.failed(w, r, "the approval request", err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"approval_id": a.ID, "action": a.Action, "state": a.State,
		"expires_at": a.ExpiresAt, "approval": a})
}

// run runs perm's action on params, touching only the channels scope
// holds (nil: all). A message out of scope is pipeline.ErrNotFound, as one
// that does not exist.
func (s *Server) run(ctx context.Context, perm identity.Permission, p actionParams, scope Scope) (any, error) {
	switch perm {
	case identity.PermReplay:
		if err := s.inScope(ctx, p.MessageID, scope); err != nil {
			return nil, err
		}
		return s.actions.Replay(ctx, p.MessageID)
	case identity.PermReplayDead:
		return s.actions.ReplayDead(ctx, p.Channel, p.Destination, scope)
	case identity.PermCancel:
		return s.actions.Cancel(ctx, p.Destination, p.Channel, p.Top, time.Duration(p.WaitMS)*time.Millisecond, scope)
	case identity.PermStepdown:
		return s.actions.Stepdown(ctx, p.Node, time.Duration(p.WaitMS)*time.Millisecond)
	case identity.PermKeysRotate:
		return s.actions.RotateKeys(ctx)
	}
	return nil, errors.New("no action " + string(perm))
}

// inScope is pipeline.ErrNotFound for a message that does not exist or
// whose channel scope does not hold.
func (s *Server) inScope(ctx context.Context, id int64, scope Scope) error {
	channel, err := s.actions.MessageChannel(ctx, id)
	if err != nil {
		return err
	}
	if scope != nil && !scope(channel) {
		return pipeline.ErrNotFound
	}
	return nil
}

// answer writes an action's result, or its error as the status a caller
// can act on.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, what string, res any, err error) {
	switch {
	case errors.Is(err, pipeline.ErrNotFound):
		writeError(w, http.StatusNotFound, notFound)
	case errors.Is(err, ErrNoKeys):
		writeError(w, http.StatusConflict, apiError{Error: ErrNoKeys.Error()})
	case errors.Is(err, pipeline.ErrBodyPurged):
		writeError(w, http.StatusConflict, apiError{Error: "the message's body was purged by retention: it cannot be replayed"})
	case err != nil:
		s.logger.ErrorContext(r.Context(), "api action failed", "action", what, "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: what + " failed; see the node's log and the audit log"})
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermReplay) {
		return
	}
	id, ok := messageID(r)
	if !ok {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	if !s.reauthed(w, r, req, identity.PermReplay) {
		return
	}
	// Out of scope answers 404 before a request for approval is stored:
	// a 202 would tell that the message exists.
	if err := s.inScope(r.Context(), id, scopeOf(req.principal)); err != nil {
		s.answer(w, r, "replay", nil, err)
		return
	}
	s.act(w, r, req, identity.PermReplay, actionParams{MessageID: id})
}

// action serves an action endpoint whose parameters come from its body
// and path: the permission is checked first, then the parameters (a bad
// one is a 422 naming its field), then the re-authentication the
// permission needs, and the action runs (or waits for approval).
func (s *Server) action(perm identity.Permission, parse func(*http.Request) (actionParams, *apiError)) func(http.ResponseWriter, *http.Request, request) {
	return func(w http.ResponseWriter, r *http.Request, req request) {
		if !require(w, req, perm) {
			return
		}
		params, e := parse(r)
		if e != nil {
			writeError(w, http.StatusUnprocessableEntity, *e)
			return
		}
		if !s.reauthed(w, r, req, perm) {
			return
		}
		s.act(w, r, req, perm, params)
	}
}

type replayDeadRequest struct {
	Channel     string `json:"channel"`
	Destination string `json:"destination"`
}

func replayDeadParams(r *http.Request) (actionParams, *apiError) {
	var body replayDeadRequest
	if e := decode(r, &body); e != nil {
		return actionParams{}, e
	}
	if body.Channel == "" && body.Destination == "" {
		return actionParams{}, &apiError{Error: "name a destination, a channel or both: replaying every dead letter of every " +
			"destination is not one request", Field: "destination"}
	}
	return actionParams{Channel: body.Channel, Destination: body.Destination}, nil
}

type cancelRequest struct {
	Top     bool   `json:"top"`
	Channel string `json:"channel"`
	// Wait is how long to wait for rows a drainer may be sending (a
	// duration, at most MaxActionWait). Defaults to the node's (10s).
	Wait string `json:"wait"`
}

func cancelParams(r *http.Request) (actionParams, *apiError) {
	var body cancelRequest
	if e := decodeOptional(r, &body); e != nil {
		return actionParams{}, e
	}
	wait, e := actionWait("wait", body.Wait)
	if e != nil {
		return actionParams{}, e
	}
	return actionParams{Destination: r.PathValue("name"), Channel: body.Channel, Top: body.Top, WaitMS: wait.Milliseconds()}, nil
}

type stepdownRequest struct {
	Node string `json:"node"`
	// Timeout bounds the wait for the node's answer (a duration, at most
	// MaxActionWait). Defaults to the node's (15s).
	Timeout string `json:"timeout"`
}

func stepdownParams(r *http.Request) (actionParams, *apiError) {
	var body stepdownRequest
	if e := decodeOptional(r, &body); e != nil {
		return actionParams{}, e
	}
	timeout, e := actionWait("timeout", body.Timeout)
	if e != nil {
		return actionParams{}, e
	}
	return actionParams{Node: body.Node, WaitMS: timeout.Milliseconds()}, nil
}

// rotateKeysParams takes an empty body: rotating re-seals the store under
// the node's active key, as `mefor keys rotate` does. It runs in the
// request: a client that goes away stops it between batches, which keep
// what they committed, and asking again picks up what is left.
func rotateKeysParams(r *http.Request) (actionParams, *apiError) {
	var body struct{}
	return actionParams{}, decodeOptional(r, &body)
}

type reauthRequest struct {
	Password string `json:"password"`
	TOTP     string `json:"totp"`
}

// reauth records on the request's session that its person proved their
// password and second factor again. It is rate-limited with the logins:
// it checks a password.
func (s *Server) reauth(w http.ResponseWriter, r *http.Request, req request) {
	src := source(r)
	if req.principal.SessionID == 0 {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "re-authentication renews a session; an API token has none (log in)",
			Field: "Authorization"})
		return
	}
	if !s.logins.allow(src) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusTooManyRequests, apiError{Error: "too many password checks from this address; try again in a minute"})
		return
	}
	var body reauthRequest
	if e := decode(r, &body); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	switch {
	case body.Password == "":
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "password is required", Field: "password"})
		return
	case body.TOTP == "":
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "totp is required: re-authentication needs the second factor", Field: "totp"})
		return
	}
	err := s.store.Reauth(r.Context(), identity.ReauthRequest{SessionID: req.principal.SessionID, Password: body.Password, TOTP: body.TOTP, Source: src})
	switch {
	case errors.Is(err, identity.ErrReauthFailed):
		writeError(w, http.StatusUnauthorized, apiError{Error: identity.ErrReauthFailed.Error()})
	case errors.Is(err, identity.ErrUseSSOReauth):
		writeError(w, http.StatusForbidden, apiError{Error: err.Error()})
	case errors.Is(err, identity.ErrUnauthenticated):
		writeError(w, http.StatusUnauthorized, apiError{Error: identity.ErrUnauthenticated.Error()})
	case err != nil:
		s.failed(w, r, "re-authentication", err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"reauthenticated": true, "valid_for": identity.ReauthWindow.String()})
	}
}

// decodeOptional is decode for a body whose every field is optional: an
// empty body is the empty object.
func decodeOptional(r *http.Request, v any) *apiError {
	b, err := io.ReadAll(io.LimitReader(r.Body, 16<<10))
	if err != nil {
		return &apiError{Error: "the body could not be read", Field: "body"}
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return decode(r, v)
}
