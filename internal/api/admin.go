package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/mefor/mefor/internal/identity"
)

// adminRoutes are the user and token changes `mefor user` and `mefor
// token` make with the database URL, for a person holding the permission
// users or tokens. Every change needs a fresh re-authentication
// (identity.ReauthFor) and is audited by identity.Store with the person
// as actor, their address and session (audit.WithOrigin).
func (s *Server) adminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/users", s.authed(s.users))
	mux.HandleFunc("POST /api/v1/users", s.authed(s.addUser))
	mux.HandleFunc("PATCH /api/v1/users/{name}", s.authed(s.setUser))
	mux.HandleFunc("POST /api/v1/users/{name}/disable", s.authed(s.setDisabled(true)))
	mux.HandleFunc("POST /api/v1/users/{name}/enable", s.authed(s.setDisabled(false)))
	mux.HandleFunc("DELETE /api/v1/users/{name}", s.authed(s.deleteUser))
	mux.HandleFunc("POST /api/v1/users/{name}/reset-mfa", s.authed(s.resetMFA))
	mux.HandleFunc("GET /api/v1/users/{name}/sessions", s.authed(s.userSessions))
	mux.HandleFunc("DELETE /api/v1/users/{name}/sessions", s.authed(s.revokeSessions))
	mux.HandleFunc("GET /api/v1/tokens", s.authed(s.tokens))
	mux.HandleFunc("POST /api/v1/tokens", s.authed(s.createToken))
	mux.HandleFunc("DELETE /api/v1/tokens/{id}", s.authed(s.revokeToken))
}

// change checks what every user or token change needs: the permission, a
// fresh re-authentication, and no access.approvals entry naming it. Dual
// control of these changes is not offered through the API: the approver
// would be handed the new user's password or token, so it is refused
// rather than skipped.
func (s *Server) change(w http.ResponseWriter, r *http.Request, req request, perm identity.Permission) bool {
	if !require(w, req, perm) || !s.reauthed(w, r, req, perm) {
		return false
	}
	if s.needsApproval(perm) {
		writeError(w, http.StatusConflict, apiError{Error: "access.approvals names " + string(perm) + ", and the API cannot put such a change " +
			"before a second person without showing them its password or token: make it with `mefor user` or `mefor token` and the database URL",
			Permission: "dual-control"})
		return false
	}
	return true
}

// adminAnswer writes a user or token change's result, or its error: 422
// naming the field of a refused value, 404 for an unknown user or token.
func (s *Server) adminAnswer(w http.ResponseWriter, r *http.Request, what string, status int, res any, err error) {
	var nf *identity.NotFoundError
	if ie, ok := identity.IsInvalid(err); ok {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: ie.Error(), Field: ie.Field})
		return
	}
	switch {
	case errors.As(err, &nf):
		writeError(w, http.StatusNotFound, apiError{Error: nf.Error()})
	case err != nil:
		s.failed(w, r, what, err)
	default:
		writeJSON(w, status, res)
	}
}

// userChange is a user as a change left it, with the second factor it
// enrolled (totp_uri, recovery_codes), shown only in this answer: the
// shape `mefor user add --json` prints.
type userChange struct {
	identity.User
	*identity.Enrollment
}

type addUserRequest struct {
	Name     string   `json:"name"`
	Role     string   `json:"role"`
	Channels []string `json:"channels"`
	Password string   `json:"password"`
}

func (s *Server) addUser(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermUsers) {
		return
	}
	var body addUserRequest
	if e := decode(r, &body); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	u, enr, err := s.store.AddUser(actorCtx(r, req), identity.NewUser{Name: body.Name, Role: body.Role, Channels: body.Channels, Password: body.Password})
	s.adminAnswer(w, r, "adding the user", http.StatusCreated, userChange{u, enr}, err)
}

// setUserRequest changes what it names; a field left out stays.
type setUserRequest struct {
	Role     *string   `json:"role"`
	Channels *[]string `json:"channels"`
}

func (s *Server) setUser(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermUsers) {
		return
	}
	var body setUserRequest
	if e := decode(r, &body); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	if body.Role == nil && body.Channels == nil {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "name a role, channels or both to change", Field: "role"})
		return
	}
	u, enr, err := s.store.SetUser(actorCtx(r, req), r.PathValue("name"), identity.Change{Role: body.Role, Channels: body.Channels})
	s.adminAnswer(w, r, "changing the user", http.StatusOK, userChange{u, enr}, err)
}

func (s *Server) setDisabled(disabled bool) func(http.ResponseWriter, *http.Request, request) {
	return func(w http.ResponseWriter, r *http.Request, req request) {
		if !s.change(w, r, req, identity.PermUsers) {
			return
		}
		u, err := s.store.SetDisabled(actorCtx(r, req), r.PathValue("name"), disabled)
		s.adminAnswer(w, r, "changing the user", http.StatusOK, u, err)
	}
}

func (s *Server) deleteUser(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermUsers) {
		return
	}
	name := r.PathValue("name")
	err := s.store.DeleteUser(actorCtx(r, req), name)
	s.adminAnswer(w, r, "deleting the user", http.StatusOK, map[string]any{"deleted": name}, err)
}

func (s *Server) resetMFA(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermUsers) {
		return
	}
	enr, err := s.store.ResetMFA(actorCtx(r, req), r.PathValue("name"))
	s.adminAnswer(w, r, "resetting the second factor", http.StatusOK, enr, err)
}

// userSessions lists a user's sessions. A read: it needs the permission,
// not a re-authentication, as GET /api/v1/users does.
func (s *Server) userSessions(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermUsers) {
		return
	}
	list, err := s.store.Sessions(r.Context(), r.PathValue("name"))
	if list == nil {
		list = []identity.Session{}
	}
	s.adminAnswer(w, r, "listing the sessions", http.StatusOK, map[string]any{"sessions": list}, err)
}

func (s *Server) revokeSessions(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermUsers) {
		return
	}
	n, err := s.store.RevokeSessions(actorCtx(r, req), r.PathValue("name"))
	s.adminAnswer(w, r, "revoking the sessions", http.StatusOK, map[string]any{"sessions_revoked": n}, err)
}

func (s *Server) tokens(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermTokens) {
		return
	}
	list, err := s.store.ListTokens(r.Context())
	if list == nil {
		list = []identity.Token{}
	}
	s.adminAnswer(w, r, "listing the tokens", http.StatusOK, map[string]any{"tokens": list}, err)
}

type createTokenRequest struct {
	User string `json:"user"`
	// Expires is 90d, 12h or never. Defaults to 90d, as the CLI's.
	Expires string `json:"expires"`
}

// createdToken is a new token with its secret, shown only in this answer.
type createdToken struct {
	identity.Token
	Secret string `json:"token"`
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermTokens) {
		return
	}
	var body createTokenRequest
	if e := decode(r, &body); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	if body.User == "" {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "user is required: the user the token acts as", Field: "user"})
		return
	}
	if body.Expires == "" {
		body.Expires = "90d"
	}
	ttl, err := identity.ParseExpiry(body.Expires)
	if err != nil {
		s.adminAnswer(w, r, "creating the token", 0, nil, err)
		return
	}
	tok, secret, err := s.store.CreateToken(actorCtx(r, req), body.User, ttl)
	s.adminAnswer(w, r, "creating the token", http.StatusCreated, createdToken{tok, secret}, err)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, req request) {
	if !s.change(w, r, req, identity.PermTokens) {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusNotFound, apiError{Error: "no token " + r.PathValue("id")})
		return
	}
	err = s.store.RevokeToken(actorCtx(r, req), id)
	s.adminAnswer(w, r, "revoking the token", http.StatusOK, map[string]any{"revoked": id}, err)
}
