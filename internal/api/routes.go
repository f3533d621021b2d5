package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/identity"
)

// SessionCookie is the session cookie's name.
const SessionCookie = "mefor_session"

// cookiePath is the session cookie's path: the whole site, so the console
// at / and the API under /api/ share one login.
const cookiePath = "/"

// CSRFHeader must carry the session's CSRF token on every write
// authenticated by the cookie.
const CSRFHeader = "X-CSRF-Token"

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/login", s.login)
	mux.HandleFunc("POST /api/v1/logout", s.authed(s.logout))
	mux.HandleFunc("GET /api/v1/me", s.authed(s.me))
	s.adminRoutes(mux)
	s.readRoutes(mux)
	s.actionRoutes(mux)
	s.ssoRoutes(mux)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiError{Error: "no such endpoint"})
	})
	if s.cfg.Console != nil {
		// The more specific /api/ patterns win, so the console gets the
		// rest of the site.
		mux.Handle("/", s.cfg.Console(mux))
	}
	return mux
}

// apiError is every error answer: 401 unauthenticated, 403 naming the
// permission (or csrf), 404, 422 naming the field, 429.
type apiError struct {
	Error      string `json:"error"`
	Permission string `json:"permission,omitempty"`
	Field      string `json:"field,omitempty"`
	// State is an approval's state when a decision on it was refused.
	State string `json:"state,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, e apiError) { writeJSON(w, status, e) }

// source is the client's address, as the connection says (no proxy
// header is trusted).
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// csrfToken is derived from the session's token: only who holds the
// cookie's value can compute it, and nothing needs storing.
func csrfToken(session string) string {
	sum := sha256.Sum256([]byte("mefor-csrf-v1:" + session))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

type loginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
	TOTP     string `json:"totp"`
}

// decode reads a JSON body of at most 16 KiB into v; an unknown field or
// a malformed body is a 422 naming it.
func decode(r *http.Request, v any) *apiError {
	dec := json.NewDecoder(io.LimitReader(r.Body, 16<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		field := "body"
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field = te.Field
		} else if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field = strings.Trim(f, `"`)
		}
		return &apiError{Error: "the body is not the JSON this endpoint takes", Field: field}
	}
	return nil
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	src := source(r)
	if !s.logins.allow(src) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusTooManyRequests, apiError{Error: "too many login attempts from this address; try again in a minute"})
		return
	}
	var req loginRequest
	if e := decode(r, &req); e != nil {
		writeError(w, http.StatusUnprocessableEntity, *e)
		return
	}
	switch {
	case req.Username == "":
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "username is required", Field: "username"})
		return
	case req.Password == "":
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "password is required", Field: "password"})
		return
	}
	l, err := s.store.Login(r.Context(), identity.LoginRequest{Username: req.Username, Password: req.Password, TOTP: req.TOTP, Source: src})
	if errors.Is(err, identity.ErrLoginFailed) {
		writeError(w, http.StatusUnauthorized, apiError{Error: identity.ErrLoginFailed.Error()})
		return
	}
	if err != nil {
		s.logger.ErrorContext(r.Context(), "api login failed", "source", src, "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: "login could not be checked; see the node's log"})
		return
	}
	s.startSession(w, l)
}

// request is an authenticated request: who, and the session token when
// it came with one.
type request struct {
	principal *identity.Principal
	session   string
}

// authed authenticates a request by its bearer token (an API token or a
// session's token) or its session cookie. A cookie-authenticated write
// must carry the session's CSRF token in X-CSRF-Token: a browser sends
// the cookie with another site's form, but that site cannot read the token.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var (
			p   *identity.Principal
			err error
			req request
		)
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			bearer = strings.TrimSpace(bearer)
			if p, err = s.store.SessionPrincipal(ctx, bearer); errors.Is(err, identity.ErrUnauthenticated) {
				p, err = s.store.TokenPrincipal(ctx, bearer)
			}
			if p != nil && p.SessionID != 0 {
				req.session = bearer
			}
		} else if c, cerr := r.Cookie(SessionCookie); cerr == nil {
			if p, err = s.store.SessionPrincipal(ctx, c.Value); err == nil && !safeMethod(r.Method) &&
				subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(csrfToken(c.Value))) != 1 {
				writeError(w, http.StatusForbidden, apiError{Error: "a write authenticated by the session cookie needs the session's csrf_token in the " + CSRFHeader + " header",
					Permission: "csrf"})
				return
			}
			req.session = c.Value
		} else {
			err = identity.ErrUnauthenticated
		}
		if errors.Is(err, identity.ErrUnauthenticated) {
			writeError(w, http.StatusUnauthorized, apiError{Error: identity.ErrUnauthenticated.Error()})
			return
		}
		if err != nil {
			s.logger.ErrorContext(ctx, "api authentication failed", "source", source(r), "err", err)
			writeError(w, http.StatusInternalServerError, apiError{Error: "authentication could not be checked; see the node's log"})
			return
		}
		req.principal = p
		h(w, r, req)
	}
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// require answers 403 naming perm when the request's role lacks it.
func require(w http.ResponseWriter, req request, perm identity.Permission) bool {
	if req.principal.Can(perm) {
		return true
	}
	writeError(w, http.StatusForbidden, apiError{Error: "your role " + req.principal.Role.Name + " lacks the permission " + string(perm),
		Permission: string(perm)})
	return false
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, req request) {
	if req.session == "" {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "logout ends a session; an API token is revoked with 'mefor token revoke'",
			Field: "Authorization"})
		return
	}
	if err := s.store.Logout(r.Context(), req.session, source(r)); err != nil && !errors.Is(err, identity.ErrUnauthenticated) {
		s.logger.ErrorContext(r.Context(), "api logout failed", "source", source(r), "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: "logout failed; see the node's log"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: cookiePath, HttpOnly: true, Secure: s.tls != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: -1, Expires: time.Unix(0, 0)})
	writeJSON(w, http.StatusOK, map[string]any{"logged_out": true})
}

func (s *Server) me(w http.ResponseWriter, r *http.Request, req request) {
	p := req.principal
	channels := p.Channels
	if channels == nil {
		channels = []string{}
	}
	out := map[string]any{"user": p.Name, "role": p.Role.Name, "permissions": p.Role.Permissions,
		"channels": channels, "session_id": p.SessionID, "token_id": p.TokenID}
	if req.session != "" {
		// A console that arrived by the SSO redirect learns its CSRF token
		// here. Another site cannot read this answer (no CORS), and the
		// token is derived from the session's, which it cannot know.
		out["csrf_token"] = csrfToken(req.session)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) users(w http.ResponseWriter, r *http.Request, req request) {
	if !require(w, req, identity.PermUsers) {
		return
	}
	list, err := s.store.ListUsers(r.Context())
	if err != nil {
		s.logger.ErrorContext(r.Context(), "api user list failed", "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: "listing users failed; see the node's log"})
		return
	}
	if list == nil {
		list = []identity.User{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"users": list})
}
