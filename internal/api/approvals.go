package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
)

var noApproval = apiError{Error: "no such approval"}

// listApprovals lists the requests of the actions the caller holds the
// permission of: those they could approve or reject.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request, req request) {
	var actions []string
	for _, p := range s.approvals.RequiredFor {
		if req.principal.Can(p) {
			actions = append(actions, string(p))
		}
	}
	if len(actions) == 0 {
		perm := "replay-dead"
		if len(s.approvals.RequiredFor) > 0 {
			perm = string(s.approvals.RequiredFor[0])
		}
		writeError(w, http.StatusForbidden, apiError{Error: "your role " + req.principal.Role.Name +
			" holds none of the permissions whose actions need an approval", Permission: perm})
		return
	}
	v := r.URL.Query()
	limit, e := onlyParams(v, "state", "limit")
	if e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	state := v.Get("state")
	switch state {
	case "", approval.StatePending, approval.StateExpired, approval.StateRejected, approval.StateRunning, approval.StateDone, approval.StateFailed:
	default:
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "state is pending, expired, rejected, running, done or failed", Field: "state"})
		return
	}
	list, err := s.approvals.Store.List(r.Context(), approval.Filter{State: state, Actions: actions, Limit: limit})
	if err != nil {
		s.failed(w, r, "the approval list", err)
		return
	}
	seen := []approval.Approval{}
	for _, a := range list {
		ok, err := s.approvalInScope(r.Context(), a, req.principal)
		if err != nil {
			s.failed(w, r, "the approval list", err)
			return
		}
		if ok {
			seen = append(seen, a)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": seen})
}

// approvalInScope reports whether a scoped person may see request a at
// all: a replay of a message of a channel they do not see, or an action
// on such a channel, is out of scope, as the message or channel itself is
// (so its existence is not revealed). A destination-wide or cluster-wide
// request is in anyone's scope who holds its permission: approved, it runs
// only on the channels both people see.
func (s *Server) approvalInScope(ctx context.Context, a approval.Approval, p *identity.Principal) (bool, error) {
	if len(p.Channels) == 0 {
		return true, nil
	}
	var params actionParams
	if err := json.Unmarshal(a.Params, &params); err != nil {
		return false, fmt.Errorf("decode the parameters of approval %d: %w", a.ID, err)
	}
	switch {
	case params.MessageID != 0:
		channel, err := s.actions.MessageChannel(ctx, params.MessageID)
		if errors.Is(err, pipeline.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return p.SeesChannel(channel), nil
	case params.Channel != "":
		return p.SeesChannel(params.Channel), nil
	}
	return true, nil
}

// both is the scope holding the channels a and b both hold.
func both(a, b Scope) Scope {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(c string) bool { return a(c) && b(c) }
}

// decideApproval approves or rejects a request. The decider holds the
// action's permission and, for an action that needs it, a fresh
// re-authentication; approving runs the action at once, in this request,
// on the channels both the requester and the approver see, with audit rows
// naming the approver as actor and the requester as requested_by. It runs
// to its end even if the approver's connection drops: it was claimed, and
// will not be claimed again.
func (s *Server) decideApproval(approve bool) func(http.ResponseWriter, *http.Request, request) {
	return func(w http.ResponseWriter, r *http.Request, req request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil || id <= 0 {
			writeError(w, http.StatusNotFound, noApproval)
			return
		}
		a, err := s.approvals.Store.Get(r.Context(), id)
		if errors.Is(err, approval.ErrNotFound) {
			writeError(w, http.StatusNotFound, noApproval)
			return
		}
		if err != nil {
			s.failed(w, r, "the approval", err)
			return
		}
		perm := identity.Permission(a.Action)
		if !require(w, req, perm) {
			return
		}
		if ok, err := s.approvalInScope(r.Context(), a, req.principal); err != nil || !ok {
			if err != nil {
				s.failed(w, r, "the approval", err)
				return
			}
			writeError(w, http.StatusNotFound, noApproval)
			return
		}
		var params actionParams
		if err := json.Unmarshal(a.Params, &params); err != nil {
			s.failed(w, r, "the approval's parameters", fmt.Errorf("decode %s: %w", a, err))
			return
		}
		var requester Scope
		if len(a.RequestedChannels) > 0 {
			requester = (&identity.Principal{Channels: a.RequestedChannels}).SeesChannel
		}
		scope := both(requester, scopeOf(req.principal))
		if approve {
			if !s.reauthed(w, r, req, perm) {
				return
			}
			// A message the approver may not see is not theirs to
			// approve: 404 before the request is claimed.
			if perm == identity.PermReplay {
				if err := s.inScope(r.Context(), params.MessageID, scope); err != nil {
					s.answer(w, r, "replay", nil, err)
					return
				}
			}
		}
		o := origin(r, req)
		d, err := s.approvals.Store.Decide(audit.WithOrigin(r.Context(), o), id, approve,
			approval.Person{Name: req.principal.Name, Channels: req.principal.Channels, Source: o.Source})
		switch {
		case errors.Is(err, approval.ErrOwnRequest):
			writeError(w, http.StatusForbidden, apiError{Error: fmt.Sprintf("approval %d is your own request: another person who holds %s must decide it", id, perm),
				Permission: "dual-control"})
			return
		case errors.Is(err, approval.ErrExpired), errors.Is(err, approval.ErrDecided):
			writeError(w, http.StatusConflict, apiError{Error: fmt.Sprintf("approval %d is %s: %v", id, d.State, errors.Unwrap(err)), State: d.State})
			return
		case err != nil:
			s.failed(w, r, "the decision", err)
			return
		}
		if !approve {
			writeJSON(w, http.StatusOK, map[string]any{"approval": d})
			return
		}
		o.ApprovalID, o.RequestedBy = id, a.RequestedBy
		ctx := audit.WithOrigin(context.WithoutCancel(r.Context()), o)
		res, runErr := s.run(ctx, perm, params, scope)
		f, err := s.approvals.Store.Finish(ctx, id, res, runErr)
		if err != nil {
			s.logger.ErrorContext(ctx, "api approval: recording the end of an approved action failed", "approval_id", id, "err", err)
		}
		if runErr != nil {
			s.answer(w, r, string(perm), nil, runErr)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"approval": f, "result": res})
	}
}
