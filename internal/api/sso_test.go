package api_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/freeport"
	"github.com/mefor/mefor/internal/identity"
)

// idp is an OpenID Connect provider in the test, speaking the protocol
// (discovery, JWKS, the code exchange with PKCE, RS256-signed ID tokens).
// It counts the code exchanges it is asked for, and can swap the nonce of
// the next authorization request, as an ID token minted for another login
// would carry.
type idp struct {
	*mockoidc.MockOIDC
	exchanges atomic.Int64
	swapNonce atomic.Bool
	// authorize is the query of the last authorization request.
	authorize atomic.Pointer[url.Values]
}

func newIdP(t *testing.T) *idp {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &idp{MockOIDC: m}
	if err := m.AddMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case mockoidc.TokenEndpoint:
				p.exchanges.Add(1)
			case mockoidc.AuthorizationEndpoint:
				q := r.URL.Query()
				p.authorize.Store(&q)
				if p.swapNonce.Load() {
					q := r.URL.Query()
					q.Set("nonce", "a-nonce-of-another-login")
					r.URL.RawQuery = q.Encode()
				}
			}
			next.ServeHTTP(w, r)
		})
	}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return p
}

// person queues who the provider authenticates at its next authorization.
func (p *idp) person(sub, username string, groups ...string) {
	p.QueueUser(&mockoidc.MockUser{Subject: sub, PreferredUsername: username, Email: username + "@example.org", Groups: groups})
}

// amrUser is a person whose ID token says how the provider authenticated
// them (the amr claim).
type amrUser struct {
	*mockoidc.MockUser
	amr []string
}

func (u *amrUser) Claims(_ []string, base *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	return &struct {
		*mockoidc.IDTokenClaims
		PreferredUsername string   `json:"preferred_username"`
		Groups            []string `json:"groups"`
		AMR               []string `json:"amr"`
	}{base, u.PreferredUsername, u.Groups, u.amr}, nil
}

// newSSOHarness is an API over HTTPS whose SSO goes to a provider in the
// test: the group lab-analysts maps to viewer on lab-*, ops to operator,
// admins to admin, whose MFA must show in the ID token's amr (mfa).
// The tests sign in more often than the login limit allows one address.
func newSSOHarness(t *testing.T) (*harness, *idp) { return newLimitedSSOHarness(t, 100) }

// newLimitedSSOHarness is newSSOHarness allowing perMinute logins from
// one address.
func newLimitedSSOHarness(t *testing.T, perMinute int) (*harness, *idp) {
	p := newIdP(t)
	listen := freeport.Addr(t, "127.0.0.1")
	h := newStoreHarness(t, api.Config{Listen: listen, LoginsPerMinute: perMinute, SSO: &api.OIDC{Issuer: p.Issuer(), ClientID: p.ClientID, ClientSecret: p.ClientSecret,
		RedirectURL: "https://" + listen + "/api/v1/sso/callback", Scopes: []string{"profile", "email", "groups"}, RequireAMR: []string{"mfa"}}}, nil,
		identity.Options{Groups: map[string]identity.GroupMapping{
			"lab-analysts": {Role: identity.RoleViewer, Channels: []string{"lab-*"}},
			"ops":          {Role: identity.RoleOperator},
			"admins":       {Role: identity.RoleAdmin},
		}})
	return h, p
}

// browser is a person's browser: a cookie jar, trusting the API's CA, and
// following redirects unless told to stop at a path (the API's callback,
// or where a re-authentication ends).
type browser struct {
	h      *harness
	client *http.Client
	stopAt string
}

func (h *harness) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		h.T.Fatal(err)
	}
	b := &browser{h: h}
	b.client = &http.Client{Jar: jar, Transport: h.client.Transport, Timeout: 30 * time.Second,
		CheckRedirect: func(r *http.Request, _ []*http.Request) error {
			if b.stopAt != "" && r.URL.Path == b.stopAt {
				return http.ErrUseLastResponse
			}
			return nil
		}}
	return b
}

// get fetches rawURL and decodes its JSON answer.
func (b *browser) get(rawURL string, cookies ...*http.Cookie) (int, map[string]any) {
	b.h.T.Helper()
	req, err := http.NewRequest("GET", rawURL, nil)
	if err != nil {
		b.h.T.Fatal(err)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.h.T.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		b.h.T.Fatalf("GET %s answered %d, not JSON: %v", rawURL, resp.StatusCode, err)
	}
	return resp.StatusCode, m
}

// login signs in through the real redirects: mefor, the provider, mefor's
// callback.
func (b *browser) login() (int, map[string]any) {
	b.stopAt = ""
	return b.get(b.h.url + "/api/v1/sso/login")
}

// startLogin follows the redirects up to the provider's answer and
// returns the callback URL it sends the browser to, unvisited, and the
// browser's login cookie.
func (b *browser) startLogin() (string, *http.Cookie) {
	b.h.T.Helper()
	b.stopAt = "/api/v1/sso/callback"
	resp, err := b.client.Get(b.h.url + "/api/v1/sso/login")
	if err != nil {
		b.h.T.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.Contains(loc, "/api/v1/sso/callback?") {
		b.h.T.Fatalf("the provider answered %d, Location %q", resp.StatusCode, loc)
	}
	u, _ := url.Parse(b.h.url)
	for _, c := range b.client.Jar.Cookies(&url.URL{Scheme: "https", Host: u.Host, Path: "/api/v1/sso/callback"}) {
		if c.Name == api.SSOCookie {
			return loc, c
		}
	}
	b.h.T.Fatal("no login cookie after GET /api/v1/sso/login")
	return "", nil
}

// lastLogin is the newest login row of the audit log: actor, outcome,
// method and reason.
func (h *harness) lastLogin() map[string]any {
	h.T.Helper()
	var target string
	var outcome string
	if err := h.DB.Pool.QueryRow(h.Ctx, `SELECT target::text, outcome FROM mefor_audit WHERE action = 'login' ORDER BY seq DESC LIMIT 1`).
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

// An OIDC login that maps a group to a scoped role: through the real
// redirects, with PKCE, the person gets a session cookie and a CSRF token,
// sees a message of their channels and gets 404 for another channel's,
// and the login is audited with their name, source and session. At their
// next login their groups are read again and their role follows.
func TestOIDCLoginMapsAGroupToAScopedRole(t *testing.T) {
	h, p := newSSOHarness(t)
	lab, adt := h.receive("lab-a", "P1"), h.receive("adt", "P2")

	p.person("sub-ana", "Ana.Lab", "lab-analysts", "unrelated")
	b := h.browser()
	status, l := b.login()
	if status != http.StatusOK || l["user"] != "ana.lab" || l["role"] != identity.RoleViewer || l["csrf_token"] == "" {
		t.Fatalf("SSO login: %d %v", status, l)
	}
	if status, m := b.get(fmt.Sprintf("%s/api/v1/messages/%d", h.url, lab)); status != http.StatusOK ||
		m["message"].(map[string]any)["channel"] != "lab-a" {
		t.Fatalf("a lab message for a lab analyst: %d %v", status, m)
	}
	if status, m := b.get(fmt.Sprintf("%s/api/v1/messages/%d", h.url, adt)); status != http.StatusNotFound {
		t.Fatalf("an adt message for a lab analyst: %d %v", status, m)
	}
	status, me := b.get(h.url + "/api/v1/me")
	if status != http.StatusOK || fmt.Sprint(me["channels"]) != "[lab-*]" || me["csrf_token"] != l["csrf_token"] {
		t.Fatalf("me after SSO: %d %v (login's csrf_token %v)", status, me, l["csrf_token"])
	}
	a := h.lastLogin()
	if a["actor"] != "ana.lab" || a["outcome"] != "ok" || a["method"] != "sso" || a["source"] != "127.0.0.1" ||
		a["session_id"] != me["session_id"] || a["subject"] != "sub-ana" {
		t.Fatalf("the login's audit row: %v", a)
	}
	// A person of the directory has no mefor password.
	if status, _, _ := h.call("POST", "/api/v1/login", map[string]string{"username": "ana.lab", "password": password}, nil); status != http.StatusUnauthorized {
		t.Fatalf("a password login to an SSO user: %d", status)
	}

	// Moved to ops in the directory: the next login makes her an
	// unscoped operator, and her open session follows at once.
	p.person("sub-ana", "ana.lab", "ops")
	if status, l := h.browser().login(); status != http.StatusOK || l["role"] != identity.RoleOperator {
		t.Fatalf("second SSO login: %d %v", status, l)
	}
	if status, m := b.get(fmt.Sprintf("%s/api/v1/messages/%d", h.url, adt)); status != http.StatusOK {
		t.Fatalf("the first session after the role changed: %d %v", status, m)
	}
}

// Each check of the callback refuses what it is there for, and the
// refusal is audited with its reason: a state this API never issued, a
// state issued to another browser (login CSRF: a callback URL planted in
// a victim's browser), a replayed callback (the provider is not even
// asked to exchange the code again), a person in no mapped group (named
// in the audit row), and an ID token carrying another login's nonce.
func TestOIDCLoginRefusals(t *testing.T) {
	h, p := newSSOHarness(t)
	refused := func(what string, status int, body map[string]any, want int, reason, actor string) {
		t.Helper()
		a := h.lastLogin()
		if status != want || a["outcome"] != "failed" || a["reason"] != reason || a["method"] != "sso" || (actor != "" && a["actor"] != actor) {
			t.Fatalf("%s: %d %v, audit %v; want %d, reason %s", what, status, body, a, want, reason)
		}
	}

	// A state nobody issued.
	p.person("sub-1", "bob", "ops")
	b := h.browser()
	cb, _ := b.startLogin()
	u, _ := url.Parse(cb)
	q := u.Query()
	q.Set("state", "forged"+q.Get("state")[6:])
	u.RawQuery = q.Encode()
	status, body := b.get(u.String())
	refused("a forged state", status, body, http.StatusUnauthorized, identity.ReasonSSOState, "")

	// Mallory's callback URL, planted in Victor's browser, which started
	// a login of its own: refused, and Victor has no session.
	p.person("sub-mallory", "mallory", "ops")
	planted, _ := h.browser().startLogin()
	victor := h.browser()
	victor.startLogin()
	status, body = victor.get(planted)
	refused("another browser's callback", status, body, http.StatusUnauthorized, identity.ReasonSSOBrowser, "")
	if status, me := victor.get(h.url + "/api/v1/me"); status != http.StatusUnauthorized {
		t.Fatalf("the victim's browser after a planted callback: %d %v", status, me)
	}

	// A sign-in that took longer than ten minutes.
	p.person("sub-slow", "slow", "ops")
	b = h.browser()
	cb, _ = b.startLogin()
	h.Exec(`UPDATE mefor_sso_login SET expires_at = now() - interval '1 second'`)
	status, body = b.get(cb)
	refused("an expired sign-in", status, body, http.StatusUnauthorized, identity.ReasonSSOExpired, "")

	// A callback replayed with its cookie: refused by mefor, before the
	// provider is asked for the code again.
	p.person("sub-carol", "carol", "ops")
	b = h.browser()
	cb, cookie := b.startLogin()
	if status, body := b.get(cb); status != http.StatusOK || body["user"] != "carol" {
		t.Fatalf("carol's login: %d %v", status, body)
	}
	exchanged := p.exchanges.Load()
	status, body = h.browser().get(cb, cookie)
	refused("a replayed callback", status, body, http.StatusUnauthorized, identity.ReasonSSOState, "")
	if n := p.exchanges.Load(); n != exchanged {
		t.Fatalf("the replayed code was sent to the provider (%d exchanges, %d before)", n, exchanged)
	}

	// A code intercepted on its way to Frank's browser, brought by Mallory
	// to a login of her own: PKCE makes the provider refuse it, as the
	// verifier of her login is not the one Frank's code was issued for.
	p.person("sub-frank", "frank", "ops")
	stolen, _ := url.Parse(func() string { cb, _ := h.browser().startLogin(); return cb }())
	mallory := h.browser()
	own, _ := mallory.startLogin()
	ou, _ := url.Parse(own)
	oq := ou.Query()
	oq.Set("code", stolen.Query().Get("code"))
	ou.RawQuery = oq.Encode()
	status, body = mallory.get(ou.String())
	refused("a stolen code", status, body, http.StatusUnauthorized, identity.ReasonSSOCode, "")

	// Authenticated by the directory, but in no group mefor maps.
	p.person("sub-dan", "dan", "marketing")
	status, body = h.browser().login()
	refused("no mapped group", status, body, http.StatusForbidden, identity.ReasonSSONoGroup, "dan")
	if n := h.Int(`SELECT count(*) FROM mefor_user WHERE name = 'dan'`); n != 0 {
		t.Fatalf("a person refused for their groups got a user row")
	}

	// An ID token for another login's nonce.
	p.swapNonce.Store(true)
	p.person("sub-erin", "erin", "ops")
	status, body = h.browser().login()
	p.swapNonce.Store(false)
	refused("another login's nonce", status, body, http.StatusUnauthorized, identity.ReasonSSONonce, "erin")

	// None of the refusals left a session.
	if n := h.Int(`SELECT count(*) FROM mefor_session s JOIN mefor_user u ON u.id = s.user_id WHERE u.name <> 'carol'`); n != 0 {
		t.Fatalf("%d sessions besides carol's", n)
	}
}

// SSO starts and callbacks count against the login limit of their source
// address, as password logins do: anyone can send a callback, and each
// refused one writes an audit row.
func TestSSOCallbacksAreRateLimited(t *testing.T) {
	h, _ := newLimitedSSOHarness(t, 3)
	b := h.browser()
	for i := range 3 {
		if status, body := b.get(h.url + "/api/v1/sso/callback?state=forged&code=x"); status != http.StatusUnauthorized {
			t.Fatalf("callback %d: %d %v", i, status, body)
		}
	}
	if status, body := b.get(h.url + "/api/v1/sso/callback?state=forged&code=x"); status != http.StatusTooManyRequests {
		t.Fatalf("the fourth callback in a minute: %d %v", status, body)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'login'`); n != 3 {
		t.Fatalf("%d login rows audited, want 3", n)
	}
}

// With require_amr, a person whose role requires MFA is let in only when
// the provider says it asked for a second factor (amr); a role without
// MFA does not need it.
func TestSSORequireAMRForRolesWithMFA(t *testing.T) {
	h, p := newSSOHarness(t)
	p.QueueUser(&amrUser{MockUser: &mockoidc.MockUser{Subject: "sub-root", PreferredUsername: "root", Groups: []string{"admins"}}, amr: []string{"pwd"}})
	status, body := h.browser().login()
	if a := h.lastLogin(); status != http.StatusForbidden || a["reason"] != identity.ReasonSSOMFA || a["actor"] != "root" {
		t.Fatalf("an admin by password only: %d %v, audit %v", status, body, a)
	}
	p.QueueUser(&amrUser{MockUser: &mockoidc.MockUser{Subject: "sub-root", PreferredUsername: "root", Groups: []string{"admins"}}, amr: []string{"pwd", "mfa"}})
	if status, body := h.browser().login(); status != http.StatusOK || body["role"] != identity.RoleAdmin {
		t.Fatalf("an admin with MFA: %d %v", status, body)
	}
	p.QueueUser(&amrUser{MockUser: &mockoidc.MockUser{Subject: "sub-vi", PreferredUsername: "vi", Groups: []string{"lab-analysts"}}, amr: []string{"pwd"}})
	if status, body := h.browser().login(); status != http.StatusOK || body["role"] != identity.RoleViewer {
		t.Fatalf("a viewer by password: %d %v", status, body)
	}
}
