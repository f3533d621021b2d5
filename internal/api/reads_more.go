package api

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
)

// onlyParams refuses a query parameter outside known, naming it, and
// reads limit (0 when absent).
func onlyParams(v url.Values, known ...string) (int, *apiError) {
	for k := range v {
		if k == "patient" {
			return 0, &apiError{Error: "a patient identifier never goes in a URL", Field: "patient"}
		}
		if !slices.Contains(known, k) {
			return 0, &apiError{Error: "unknown query parameter " + k, Field: k}
		}
	}
	l := v.Get("limit")
	if l == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 0 || n > maxListLimit {
		return 0, &apiError{Error: "limit is a number of rows, 1 to 1000 (0 for the default)", Field: "limit"}
	}
	return n, nil
}

// dead is `mefor dead list`: the dead letters of the caller's channels.
func (s *Server) dead(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermDeadRead) {
		return
	}
	v := r.URL.Query()
	limit, e := onlyParams(v, "channel", "destination", "limit")
	if e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	rows, err := s.reads.Dead(actorCtx(r, req), pipeline.DeadFilter{Channel: v.Get("channel"), Destination: v.Get("destination"), Limit: limit},
		req.principal.Channels)
	if err != nil {
		s.failed(w, r, "the dead-letter list", err)
		return
	}
	if rows == nil {
		rows = []search.DeadRow{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead": rows})
}

// auditLog is `mefor audit list`. Its rows name messages, destinations
// and people of every channel, and no channel of theirs can be told
// reliably, so a user with a channel scope is refused it.
func (s *Server) auditLog(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermAuditRead) {
		return
	}
	if len(req.principal.Channels) > 0 {
		writeError(w, http.StatusForbidden, apiError{Error: "the audit log spans every channel; a user with a channel scope cannot read it",
			Permission: string(identity.PermAuditRead)})
		return
	}
	v := r.URL.Query()
	limit, e := onlyParams(v, "since", "action", "limit")
	if e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	f := audit.Filter{Action: v.Get("action"), Limit: limit}
	if f.Since, e = when("since", v.Get("since")); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	rows, err := s.reads.Audit(r.Context(), f)
	if err != nil {
		s.failed(w, r, "the audit log", err)
		return
	}
	if rows == nil {
		rows = []audit.Record{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"audit": rows})
}
