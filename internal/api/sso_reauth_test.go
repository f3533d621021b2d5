package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
)

// signedUser is a person whose ID token says how (amr) and when
// (auth_time; none when authTime is zero) the provider authenticated them.
type signedUser struct {
	*mockoidc.MockUser
	amr      []string
	authTime time.Time
}

func (u *signedUser) Claims(_ []string, base *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	var at *int64
	if !u.authTime.IsZero() {
		sec := u.authTime.Unix()
		at = &sec
	}
	return &struct {
		*mockoidc.IDTokenClaims
		PreferredUsername string   `json:"preferred_username"`
		Groups            []string `json:"groups"`
		AMR               []string `json:"amr"`
		AuthTime          *int64   `json:"auth_time,omitempty"`
	}{base, u.PreferredUsername, u.Groups, u.amr, at}, nil
}

// admin queues, for the provider's next authorization, sub signed in as
// name in the admins group with a second factor (amr mfa) at authTime.
func (p *idp) admin(sub, name string, authTime time.Time, amr ...string) {
	if amr == nil {
		amr = []string{"pwd", "mfa"}
	}
	p.QueueUser(&signedUser{MockUser: &mockoidc.MockUser{Subject: sub, PreferredUsername: name, Groups: []string{"admins"}},
		amr: amr, authTime: authTime})
}

// reauth goes through GET /api/v1/sso/reauth and the provider's redirects,
// stopping where the callback sends the browser on success. It returns the
// last answer's status, its Location and its JSON body, if any.
func (b *browser) reauth() (int, string, map[string]any) {
	b.h.T.Helper()
	b.stopAt = "/"
	resp, err := b.client.Get(b.h.url + "/api/v1/sso/reauth")
	if err != nil {
		b.h.T.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, resp.Header.Get("Location"), m
}

// call sends a JSON request in the browser's session, with csrf.
func (b *browser) call(method, path string, body any, csrf any) (int, map[string]any) {
	b.h.T.Helper()
	u, _ := url.Parse(b.h.url)
	for _, c := range b.client.Jar.Cookies(&url.URL{Scheme: "https", Host: u.Host, Path: "/api/v1/"}) {
		if c.Name == api.SessionCookie {
			status, res, _ := b.h.call(method, path, body, map[string]string{api.CSRFHeader: fmt.Sprint(csrf)}, c)
			return status, res
		}
	}
	b.h.T.Fatal("no session cookie in the browser")
	return 0, nil
}

// lastReauth is the newest reauth row of the audit log, as lastLogin.
func (h *harness) lastReauth() map[string]any {
	h.T.Helper()
	var target, outcome string
	if err := h.DB.Pool.QueryRow(h.Ctx, `SELECT target::text, outcome FROM mefor_audit WHERE action = 'reauth' ORDER BY seq DESC LIMIT 1`).
		Scan(&target, &outcome); err != nil {
		h.T.Fatal(err)
	}
	m := map[string]any{}
	if err := json.Unmarshal([]byte(target), &m); err != nil {
		h.T.Fatal(err)
	}
	m["outcome"] = outcome
	return m
}

// An admin who signs in through the directory has no password to give
// POST /api/v1/reauth: their stepdown is refused naming reauth until they
// sign in again at the provider through GET /api/v1/sso/reauth (which asks
// it for a fresh login: prompt=login, max_age=0), then allowed, and
// refused again once the window has passed. The re-authentication is
// audited as action reauth, method sso, naming them and their session.
func TestSSOPersonReauthenticatesThroughTheProvider(t *testing.T) {
	h, p := newSSOHarness(t)
	p.admin("sub-root", "root", time.Now())
	b := h.browser()
	status, l := b.login()
	if status != http.StatusOK || l["role"] != identity.RoleAdmin {
		t.Fatalf("SSO login: %d %v", status, l)
	}
	stepdown := func() (int, map[string]any) {
		return b.call("POST", "/api/v1/cluster/stepdown", map[string]any{}, l["csrf_token"])
	}
	if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" || !strings.Contains(fmt.Sprint(e["error"]), "/api/v1/sso/reauth") {
		t.Fatalf("stepdown without a re-authentication: %d %v", status, e)
	}
	if status, e := b.call("POST", "/api/v1/reauth", map[string]string{"password": password, "totp": "123456"}, l["csrf_token"]); status != http.StatusForbidden ||
		!strings.Contains(fmt.Sprint(e["error"]), "GET /api/v1/sso/reauth") {
		t.Fatalf("a password re-authentication of an SSO person: %d %v", status, e)
	}

	p.admin("sub-root", "root", time.Now())
	status, loc, body := b.reauth()
	if status != http.StatusSeeOther || loc != "/" {
		t.Fatalf("SSO re-authentication: %d, Location %q, %v", status, loc, body)
	}
	if q := p.authorize.Load(); q == nil || q.Get("prompt") != "login" || q.Get("max_age") != "0" ||
		q.Get("code_challenge_method") != "S256" || q.Get("nonce") == "" || q.Get("state") == "" {
		t.Fatalf("the re-authentication's authorization request: %v", q)
	}
	if status, body := stepdown(); status != http.StatusOK || body["outcome"] != ops.OutcomeNoHolder {
		t.Fatalf("stepdown after the SSO re-authentication: %d %v", status, body)
	}
	_, me := b.get(h.url + "/api/v1/me")
	if a := h.lastReauth(); a["outcome"] != "ok" || a["method"] != "sso" || a["actor"] != "root" || a["session_id"] != me["session_id"] ||
		a["subject"] != "sub-root" || a["source"] != "127.0.0.1" {
		t.Fatalf("the re-authentication's audit row: %v (session %v)", a, me["session_id"])
	}
	h.clock.Advance(identity.ReauthWindow + time.Second)
	if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" {
		t.Fatalf("stepdown past the window: %d %v", status, e)
	}
}

// A re-authentication's ID token must be a fresh sign-in of the session's
// own person: another person's (Mallory signs in at the provider in the
// admin's browser), one without auth_time or with an old one (the provider
// let a standing session through), and with require_amr one without a
// second factor, and one with another flow's nonce are refused, audited
// with their reason as the session's re-authentication, and leave the
// stepdown refused; a good one then works. A person who logs in with a
// password cannot use the endpoint at all.
func TestSSOReauthRefusals(t *testing.T) {
	h, p := newSSOHarness(t)
	p.admin("sub-mallory", "mallory", time.Now())
	if status, l := h.browser().login(); status != http.StatusOK {
		t.Fatalf("mallory's login: %d %v", status, l)
	}
	p.admin("sub-root", "root", time.Now())
	b := h.browser()
	_, l := b.login()
	stepdown := func() (int, map[string]any) {
		return b.call("POST", "/api/v1/cluster/stepdown", map[string]any{}, l["csrf_token"])
	}

	refused := func(what string, want int, reason, says string) {
		t.Helper()
		status, loc, body := b.reauth()
		a := h.lastReauth()
		if status != want || loc != "" || a["outcome"] != "failed" || a["reason"] != reason || a["method"] != "sso" || a["actor"] != "root" ||
			!strings.Contains(fmt.Sprint(body["error"]), says) {
			t.Fatalf("%s: %d %q %v, audit %v; want %d, reason %s", what, status, loc, body, a, want, reason)
		}
		if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" {
			t.Fatalf("stepdown after %s: %d %v", what, status, e)
		}
	}
	p.admin("sub-mallory", "mallory", time.Now())
	refused("another person's ID token", http.StatusForbidden, identity.ReasonSSOSubject, "someone other than this session's user")
	p.admin("sub-root", "root", time.Now().Add(-identity.ReauthWindow-time.Minute))
	refused("an old auth_time", http.StatusUnauthorized, identity.ReasonSSOAuthTime, "did not sign you in again just now")
	p.admin("sub-root", "root", time.Time{})
	refused("no auth_time", http.StatusUnauthorized, identity.ReasonSSOAuthTime, "did not say when you signed in")
	p.admin("sub-root", "root", time.Now(), "pwd")
	refused("no second factor under require_amr", http.StatusForbidden, identity.ReasonSSOMFA, "requires a second factor")
	// The login's checks hold too, and their refusals are audited as the
	// session's re-authentication.
	p.swapNonce.Store(true)
	p.admin("sub-root", "root", time.Now())
	refused("another flow's nonce", http.StatusUnauthorized, identity.ReasonSSONonce, "start again at /api/v1/sso/reauth")
	p.swapNonce.Store(false)

	p.admin("sub-root", "root", time.Now())
	if status, loc, body := b.reauth(); status != http.StatusSeeOther || loc != "/" {
		t.Fatalf("a good re-authentication after the refusals: %d %q %v", status, loc, body)
	}
	if status, body := stepdown(); status != http.StatusOK {
		t.Fatalf("stepdown after the good re-authentication: %d %v", status, body)
	}

	// A password person is told to use their password; no flow starts.
	secret := h.add("alice", identity.RoleAdmin)
	cookie, _ := h.login("alice", secret)
	before := h.Int(`SELECT count(*) FROM mefor_sso_login`)
	status, e, _ := h.call("GET", "/api/v1/sso/reauth", nil, nil, cookie)
	if status != http.StatusForbidden || !strings.Contains(fmt.Sprint(e["error"]), "POST /api/v1/reauth") {
		t.Fatalf("GET /api/v1/sso/reauth in a password session: %d %v", status, e)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_sso_login`); n != before {
		t.Fatalf("a password session started an SSO flow (%d rows, %d before)", n, before)
	}
	if status, e, _ := h.call("GET", "/api/v1/sso/reauth", nil, nil); status != http.StatusUnauthorized {
		t.Fatalf("GET /api/v1/sso/reauth without a session: %d %v", status, e)
	}
}
