package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/mefor/mefor/internal/identity"
)

// SSOCookie holds the random value that binds a login under way to the
// browser that started it (its SHA-256 is stored with the login's state).
const SSOCookie = "mefor_sso"

// ssoCookiePath scopes the login cookie to the two SSO endpoints.
const ssoCookiePath = "/api/v1/sso/"

// OIDC is an OpenID Connect provider the API logs people in through.
type OIDC struct {
	// Issuer is the provider's issuer URL.
	Issuer string
	// ClientID and ClientSecret are mefor's registration at the provider.
	ClientID, ClientSecret string
	// RedirectURL is this API's /api/v1/sso/callback as registered.
	RedirectURL string
	// GroupsClaim names the ID token claim listing the person's groups.
	// Defaults to groups.
	GroupsClaim string
	// Scopes are requested besides openid. Defaults to profile and email.
	Scopes []string
	// RequireAMR, when set, refuses a person whose role requires MFA
	// unless the ID token's amr claim holds one of these values. Defaults
	// to none: MFA is the provider's policy.
	RequireAMR []string
	// HTTPClient reaches the provider (discovery, keys, code exchange).
	// Defaults to a client with a 30s timeout; a node gives one that
	// dials through its egress policy.
	HTTPClient *http.Client
}

// sso is the client side of the authorization code flow with PKCE. The
// provider's discovery document is read at the first login and kept; a
// provider that cannot be reached is tried again at the next.
type sso struct {
	cfg OIDC

	mu       sync.Mutex
	provider *oidc.Provider
}

func newSSO(cfg OIDC) *sso {
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.Scopes == nil {
		cfg.Scopes = []string{"profile", "email"}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	return &sso{cfg: cfg}
}

func (o *sso) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, o.cfg.HTTPClient)
}

// discover returns the provider, reading its discovery document once.
func (o *sso) discover(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider != nil {
		return o.provider, nil
	}
	// The provider keeps the client of this context for its keys, not the
	// context's deadline.
	p, err := oidc.NewProvider(o.ctx(ctx), o.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("read the OIDC provider's discovery document at %s: %w", o.cfg.Issuer, err)
	}
	o.provider = p
	return p, nil
}

func (o *sso) oauth(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: o.cfg.ClientID, ClientSecret: o.cfg.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: o.cfg.RedirectURL, Scopes: append([]string{oidc.ScopeOpenID}, o.cfg.Scopes...)}
}

// ssoClaims are the ID token claims mefor reads besides the registered
// ones; the groups claim is read by name (ssoGroups).
type ssoClaims struct {
	PreferredUsername string   `json:"preferred_username"`
	Email             string   `json:"email"`
	AMR               []string `json:"amr"`
	// AuthTime is when the provider last authenticated the person, in
	// seconds since the epoch; a re-authentication needs it.
	AuthTime *float64 `json:"auth_time"`
}

// ssoGroups reads the groups claim: a list of strings, or one string.
func ssoGroups(tok *oidc.IDToken, claim string) []string {
	var all map[string]json.RawMessage
	if tok.Claims(&all) != nil {
		return nil
	}
	raw, ok := all[claim]
	if !ok {
		return nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	var one string
	if json.Unmarshal(raw, &one) == nil && one != "" {
		return []string{one}
	}
	return nil
}

// ssoLogin starts a login: it records the state, nonce and PKCE verifier
// server-side, gives the browser the cookie that binds them to it, and
// sends it to the provider.
func (s *Server) ssoLogin(w http.ResponseWriter, r *http.Request) {
	src := source(r)
	if !s.logins.allow(src) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusTooManyRequests, apiError{Error: "too many login attempts from this address; try again in a minute"})
		return
	}
	p, err := s.sso.discover(r.Context())
	if err != nil {
		s.logger.ErrorContext(r.Context(), "api SSO: the identity provider cannot be reached", "issuer", s.sso.cfg.Issuer, "err", err)
		writeError(w, http.StatusBadGateway, apiError{Error: "the identity provider cannot be reached; see the node's log"})
		return
	}
	st, err := s.store.BeginSSO(r.Context(), src)
	if err != nil {
		s.logger.ErrorContext(r.Context(), "api SSO login could not start", "source", src, "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: "single sign-on could not start; see the node's log"})
		return
	}
	s.toProvider(w, r, p, st)
}

// ssoReauth starts a re-authentication through the provider for the
// request's session, whose person logs in through SSO: the same flow as a
// login, asking the provider to authenticate the person again whatever
// session it holds (prompt=login, and max_age=0, which also makes it
// return auth_time, OIDC core 3.1.2.1). The callback renews this session.
func (s *Server) ssoReauth(w http.ResponseWriter, r *http.Request, req request) {
	src := source(r)
	if req.principal.SessionID == 0 {
		writeError(w, http.StatusUnprocessableEntity, apiError{Error: "re-authentication renews a session; an API token has none (log in)",
			Field: "Authorization"})
		return
	}
	if !s.logins.allow(src) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusTooManyRequests, apiError{Error: "too many login attempts from this address; try again in a minute"})
		return
	}
	p, err := s.sso.discover(r.Context())
	if err != nil {
		s.logger.ErrorContext(r.Context(), "api SSO: the identity provider cannot be reached", "issuer", s.sso.cfg.Issuer, "err", err)
		writeError(w, http.StatusBadGateway, apiError{Error: "the identity provider cannot be reached; see the node's log"})
		return
	}
	st, err := s.store.BeginSSOReauth(r.Context(), req.principal.SessionID, src)
	switch {
	case errors.Is(err, identity.ErrNotSSOUser):
		writeError(w, http.StatusForbidden, apiError{Error: err.Error()})
		return
	case errors.Is(err, identity.ErrUnauthenticated):
		writeError(w, http.StatusUnauthorized, apiError{Error: identity.ErrUnauthenticated.Error()})
		return
	case err != nil:
		s.failed(w, r, "the SSO re-authentication", err)
		return
	}
	s.toProvider(w, r, p, st, oauth2.SetAuthURLParam("prompt", "login"), oauth2.SetAuthURLParam("max_age", "0"))
}

// toProvider gives the browser the cookie that binds the flow st to it and
// sends it to the provider.
func (s *Server) toProvider(w http.ResponseWriter, r *http.Request, p *oidc.Provider, st *identity.SSOStart, opts ...oauth2.AuthCodeOption) {
	// SameSite=Lax, not Strict: the provider sends the browser back with a
	// top-level GET from its own site, which a Strict cookie would miss.
	http.SetCookie(w, &http.Cookie{Name: SSOCookie, Value: st.Browser, Path: ssoCookiePath, HttpOnly: true,
		Secure: s.tls != nil, SameSite: http.SameSiteLaxMode, MaxAge: int(identity.SSOLoginTTL / time.Second)})
	w.Header().Set("Cache-Control", "no-store")
	opts = append([]oauth2.AuthCodeOption{oidc.Nonce(st.Nonce), oauth2.S256ChallengeOption(st.Verifier)}, opts...)
	http.Redirect(w, r, s.sso.oauth(p).AuthCodeURL(st.State, opts...), http.StatusFound)
}

// ssoCallback finishes a login: the state must be one this API issued to
// this browser and not used yet, the code is exchanged with the PKCE
// verifier, the ID token must verify (signature, issuer, audience,
// expiry) and carry the login's nonce, and the person's groups must map
// to a role. It answers as POST /api/v1/login does.
func (s *Server) ssoCallback(w http.ResponseWriter, r *http.Request) {
	ctx, src, q := r.Context(), source(r), r.URL.Query()
	// Counted like a login: each callback may write an audit row and call
	// the provider, and anyone can send one.
	if !s.logins.allow(src) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusTooManyRequests, apiError{Error: "too many login attempts from this address; try again in a minute"})
		return
	}
	// The login cookie is used once, whatever happens.
	http.SetCookie(w, &http.Cookie{Name: SSOCookie, Value: "", Path: ssoCookiePath, HttpOnly: true, Secure: s.tls != nil,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
	refuse := func(err error) {
		if rf, ok := identity.IsSSORefused(err); ok {
			status := http.StatusUnauthorized
			if rf.Forbidden() {
				status = http.StatusForbidden
			}
			writeError(w, status, apiError{Error: rf.Error()})
			return
		}
		s.logger.ErrorContext(ctx, "api SSO login failed", "source", src, "err", err)
		writeError(w, http.StatusInternalServerError, apiError{Error: "single sign-on could not be checked; see the node's log"})
	}
	browser := ""
	if c, err := r.Cookie(SSOCookie); err == nil {
		browser = c.Value
	}
	pending, err := s.store.ResumeSSO(ctx, q.Get("state"), browser, src)
	if err != nil {
		refuse(err)
		return
	}
	// A refusal is audited as what the flow was for: a login, or the
	// session's re-authentication.
	refuseFlow := func(name, reason, message string) error {
		if pending.Reauth() {
			return s.store.RefuseSSOReauth(ctx, pending, src, reason, message)
		}
		return s.store.RefuseSSO(ctx, name, src, reason, message)
	}
	if e := q.Get("error"); e != "" {
		// The provider's error code is a short token (access_denied); its
		// description may quote the person, so it is not kept.
		s.logger.WarnContext(ctx, "api SSO: the identity provider refused the sign-in", "source", src, "error", truncate(e, 64))
		refuse(refuseFlow("", identity.ReasonSSOIdPError, "the identity provider refused the sign-in ("+truncate(e, 64)+")"))
		return
	}
	p, err := s.sso.discover(ctx)
	if err != nil {
		refuse(err)
		return
	}
	octx, cancel := context.WithTimeout(s.sso.ctx(ctx), 30*time.Second)
	defer cancel()
	tok, err := s.sso.oauth(p).Exchange(octx, q.Get("code"), oauth2.VerifierOption(pending.Verifier))
	if err != nil {
		s.logger.WarnContext(ctx, "api SSO: the code was not exchanged", "source", src, "err", err)
		refuse(refuseFlow("", identity.ReasonSSOCode, "the identity provider did not accept the sign-in's code; start again at "+pending.Restart()))
		return
	}
	rawID, _ := tok.Extra("id_token").(string)
	id, err := p.Verifier(&oidc.Config{ClientID: s.sso.cfg.ClientID}).Verify(octx, rawID)
	if rawID == "" || err != nil {
		s.logger.WarnContext(ctx, "api SSO: no valid ID token", "source", src, "err", err)
		refuse(refuseFlow("", identity.ReasonSSOIDToken, "the identity provider's ID token did not verify; see the node's log"))
		return
	}
	var claims ssoClaims
	if err := id.Claims(&claims); err != nil {
		refuse(fmt.Errorf("read ID token claims: %w", err))
		return
	}
	name := claims.PreferredUsername
	if name == "" {
		name = claims.Email
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if subtle.ConstantTimeCompare([]byte(id.Nonce), []byte(pending.Nonce)) != 1 {
		refuse(refuseFlow(truncate(name, 64), identity.ReasonSSONonce, "the ID token was not issued for this sign-in; start again at "+pending.Restart()))
		return
	}
	if pending.Reauth() {
		s.finishReauth(w, r, pending, id, claims)
		return
	}
	l, err := s.store.SSOLogin(ctx, identity.SSOIdentity{Issuer: id.Issuer, Subject: id.Subject, Name: name,
		Groups: ssoGroups(id, s.sso.cfg.GroupsClaim), Source: src, AMR: claims.AMR, RequireAMR: s.sso.cfg.RequireAMR})
	if err != nil {
		refuse(err)
		return
	}
	s.startSession(w, l)
}

// finishReauth renews the session of a re-authentication whose ID token
// verified and carries its nonce (identity.Store.SSOReauth checks it names
// the session's user and was issued at a fresh sign-in), then sends the
// browser to the console's start page: a fixed same-origin path, never one
// a request names.
func (s *Server) finishReauth(w http.ResponseWriter, r *http.Request, pending *identity.SSOPending, id *oidc.IDToken, claims ssoClaims) {
	ctx, src := r.Context(), source(r)
	var at time.Time
	if claims.AuthTime != nil {
		sec, frac := math.Modf(*claims.AuthTime)
		at = time.Unix(int64(sec), int64(frac*1e9))
	}
	err := s.store.SSOReauth(ctx, pending, identity.SSOReauthIdentity{Issuer: id.Issuer, Subject: id.Subject, AuthTime: at,
		AMR: claims.AMR, RequireAMR: s.sso.cfg.RequireAMR, Source: src})
	if rf, ok := identity.IsSSORefused(err); ok {
		status := http.StatusUnauthorized
		if rf.Forbidden() {
			status = http.StatusForbidden
		}
		writeError(w, status, apiError{Error: rf.Error()})
		return
	}
	switch {
	case errors.Is(err, identity.ErrUnauthenticated):
		writeError(w, http.StatusUnauthorized, apiError{Error: "the session this re-authentication was for has ended; log in again"})
		return
	case err != nil:
		s.failed(w, r, "the SSO re-authentication", err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, reauthDone, http.StatusSeeOther)
}

// reauthDone is where a browser goes after its re-authentication through
// the provider: the console's start page, on this origin.
const reauthDone = "/"

// startSession answers a login: the session cookie, and the CSRF token in
// the body.
func (s *Server) startSession(w http.ResponseWriter, l *identity.Login) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: l.Token, Path: cookiePath, HttpOnly: true,
		Secure: s.tls != nil, SameSite: http.SameSiteStrictMode, Expires: l.ExpiresAt})
	writeJSON(w, http.StatusOK, map[string]any{"csrf_token": csrfToken(l.Token), "user": l.Principal.Name,
		"role": l.Principal.Role.Name, "expires_at": l.ExpiresAt})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ssoRoutes serves the SSO endpoints when the API has a provider; without
// one they answer 404 like any unknown endpoint.
func (s *Server) ssoRoutes(mux *http.ServeMux) {
	if s.sso == nil {
		return
	}
	mux.HandleFunc("GET /api/v1/sso/login", s.ssoLogin)
	mux.HandleFunc("GET /api/v1/sso/callback", s.ssoCallback)
	mux.HandleFunc("GET /api/v1/sso/reauth", s.authed(s.ssoReauth))
}
