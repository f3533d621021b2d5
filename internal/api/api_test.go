package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

const password = "correct horse battery"

// harness is an API server over real HTTPS on loopback, on a database of
// the test's own, and a client that trusts its CA.
type harness struct {
	*fixtures.DBTest
	store  *identity.Store
	url    string
	client *http.Client
	keys   *crypt.Keyring
	// clock is the identity store's and the approvals' clock: tests move
	// it instead of sleeping.
	clock *fixtures.Clock
}

func newHarness(t *testing.T, cfg api.Config) *harness { return newKeyedHarness(t, cfg, nil) }

// newKeyedHarness is newHarness whose reads, and the messages the test
// stores, use keys (nil: content in clear).
func newKeyedHarness(t *testing.T, cfg api.Config, keys *crypt.Keyring) *harness {
	return newStoreHarness(t, cfg, keys, identity.Options{})
}

// newStoreHarness is newKeyedHarness whose identity store has opts (its
// custom roles, its groups), with cheap password hashes and the harness's
// clock. A cfg.Listen given is kept (an SSO redirect URL names it).
func newStoreHarness(t *testing.T, cfg api.Config, keys *crypt.Keyring, opts identity.Options) *harness {
	h := &harness{DBTest: fixtures.NewDBTest(t), keys: keys, clock: &fixtures.Clock{}}
	opts.Argon2 = identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}
	if opts.Now == nil {
		opts.Now = h.clock.Now
	}
	h.store = identity.New(h.DB.Pool, opts)
	if cfg.Reads == nil {
		cfg.Reads = ops.APIReads{Pool: h.DB.Pool, Keys: keys}
	}
	if cfg.Actions == nil {
		cfg.Actions = ops.APIActions{Pool: h.DB.Pool, CancelWait: time.Second, StepdownTimeout: time.Second, Keys: keys}
	}
	if len(cfg.Approvals.RequiredFor) > 0 && cfg.Approvals.Store == nil {
		cfg.Approvals.Store = approval.New(h.DB.Pool, approval.Options{Now: h.clock.Now})
	}
	ca := certtest.NewCA(t, "mefor test CA")
	cfg.CertFile, cfg.KeyFile = ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, t.TempDir(), "api")
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	srv, err := api.New(cfg, h.store, fixtures.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	h.url = "https://" + ln.Addr().String()
	h.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	return h
}

// call sends a JSON request with the given headers and returns the status,
// the decoded JSON answer and the response.
func (h *harness) call(method, path string, body any, headers map[string]string, cookies ...*http.Cookie) (int, map[string]any, *http.Response) {
	h.T.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.T.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.T.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		h.T.Fatalf("%s %s answered %d, not JSON: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, m, resp
}

func (h *harness) add(name, role string) string {
	h.T.Helper()
	_, enr, err := h.store.AddUser(h.Ctx, identity.NewUser{Name: name, Role: role, Password: password})
	if err != nil {
		h.T.Fatal(err)
	}
	if enr == nil {
		return ""
	}
	key, err := otp.NewKeyFromURL(enr.TOTPURI)
	if err != nil {
		h.T.Fatal(err)
	}
	return key.Secret()
}

func sessionCookie(t *testing.T, resp *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == api.SessionCookie {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", api.SessionCookie, resp.Header["Set-Cookie"])
	return nil
}

// An admin logs in over HTTPS with password and TOTP: the session cookie
// is HttpOnly, Secure and SameSite=Strict, and the answer carries the CSRF
// token; a cookie-authenticated write without it is refused; logout ends
// the session.
func TestLoginSessionCSRFAndLogout(t *testing.T) {
	h := newHarness(t, api.Config{})
	secret := h.add("alice", identity.RoleAdmin)

	status, wrong, _ := h.call("POST", "/api/v1/login", map[string]string{"username": "alice", "password": "not the password"}, nil)
	_, unknown, _ := h.call("POST", "/api/v1/login", map[string]string{"username": "nobody", "password": password}, nil)
	if status != http.StatusUnauthorized || wrong["error"] != unknown["error"] {
		t.Fatalf("wrong password: %d %v; unknown user: %v", status, wrong, unknown)
	}

	code, _ := identity.TOTPCode(secret, time.Now())
	status, body, resp := h.call("POST", "/api/v1/login", map[string]string{"username": "alice", "password": password, "totp": code}, nil)
	if status != http.StatusOK || body["csrf_token"] == nil || body["csrf_token"] == "" {
		t.Fatalf("login: %d %v", status, body)
	}
	c := sessionCookie(t, resp)
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Fatalf("session cookie %+v: want HttpOnly, Secure, SameSite=Strict, path / (the console's pages share it)", c)
	}
	if status, me, _ := h.call("GET", "/api/v1/me", nil, nil, c); status != http.StatusOK || me["user"] != "alice" || me["role"] != "admin" {
		t.Fatalf("me: %d %v", status, me)
	}
	if status, e, _ := h.call("POST", "/api/v1/logout", nil, nil, c); status != http.StatusForbidden || e["permission"] != "csrf" {
		t.Fatalf("logout by cookie without the CSRF header: %d %v", status, e)
	}
	if status, e, _ := h.call("POST", "/api/v1/logout", nil, map[string]string{api.CSRFHeader: "forged"}, c); status != http.StatusForbidden {
		t.Fatalf("logout with a wrong CSRF token: %d %v", status, e)
	}
	if status, _, _ := h.call("GET", "/api/v1/me", nil, nil, c); status != http.StatusOK {
		t.Fatal("the refused logout ended the session")
	}
	if status, e, _ := h.call("POST", "/api/v1/logout", nil, map[string]string{api.CSRFHeader: body["csrf_token"].(string)}, c); status != http.StatusOK {
		t.Fatalf("logout: %d %v", status, e)
	}
	if status, e, _ := h.call("GET", "/api/v1/me", nil, nil, c); status != http.StatusUnauthorized {
		t.Fatalf("me after logout: %d %v", status, e)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'logout' AND target::jsonb->>'actor' = 'alice'`); n != 1 {
		t.Errorf("%d logout rows naming alice", n)
	}
}

// A bearer token needs no CSRF header; a revoked one is 401; a role
// without a permission gets 403 naming it; a bad body is 422 naming the
// field.
func TestBearerTokenPermissionsAndErrors(t *testing.T) {
	h := newHarness(t, api.Config{})
	h.add("vic", identity.RoleViewer)
	tok, secret, err := h.store.CreateToken(h.Ctx, "vic", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bearer := map[string]string{"Authorization": "Bearer " + secret}
	if status, me, _ := h.call("GET", "/api/v1/me", nil, bearer); status != http.StatusOK || me["user"] != "vic" {
		t.Fatalf("me by token: %d %v", status, me)
	}
	if status, e, _ := h.call("GET", "/api/v1/users", nil, bearer); status != http.StatusForbidden || e["permission"] != "users" {
		t.Fatalf("a viewer listing users: %d %v", status, e)
	}
	// A session's token as bearer: a write without the CSRF header.
	sess, err := h.store.Login(h.Ctx, identity.LoginRequest{Username: "vic", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	if status, e, _ := h.call("POST", "/api/v1/logout", nil, map[string]string{"Authorization": "Bearer " + sess.Token}); status != http.StatusOK {
		t.Fatalf("logout by bearer session token without CSRF: %d %v", status, e)
	}
	if err := h.store.RevokeToken(h.Ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if status, e, _ := h.call("GET", "/api/v1/me", nil, bearer); status != http.StatusUnauthorized {
		t.Fatalf("a revoked token: %d %v", status, e)
	}
	if status, e, _ := h.call("POST", "/api/v1/login", map[string]any{"username": "vic"}, nil); status != http.StatusUnprocessableEntity || e["field"] != "password" {
		t.Fatalf("login without a password: %d %v", status, e)
	}
	if status, e, _ := h.call("POST", "/api/v1/login", map[string]any{"username": "vic", "password": password, "otp": "1"}, nil); status != http.StatusUnprocessableEntity || e["field"] != "otp" {
		t.Fatalf("login with an unknown field: %d %v", status, e)
	}
}

// Login is rate-limited per source address, before the password is
// checked.
func TestLoginRateLimitedPerSource(t *testing.T) {
	h := newHarness(t, api.Config{LoginsPerMinute: 3})
	h.add("vic", identity.RoleViewer)
	for i := range 3 {
		if status, e, _ := h.call("POST", "/api/v1/login", map[string]string{"username": "vic", "password": "wrong password"}, nil); status != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d %v", i+1, status, e)
		}
	}
	status, e, resp := h.call("POST", "/api/v1/login", map[string]string{"username": "vic", "password": password}, nil)
	if status != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the fourth attempt within a minute: %d %v", status, e)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'login'`); n != 3 {
		t.Errorf("%d login rows: the limited attempt reached the password check", n)
	}
}

// The listener is gated by admission: a source outside the allow list is
// closed before its TLS handshake.
func TestListenerIsGatedByAdmission(t *testing.T) {
	allow, err := admission.NewSources([]string{"192.0.2.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, api.Config{Admission: admission.Policy{Allow: allow}})
	_, err = h.client.Get(h.url + "/api/v1/me")
	var opErr *net.OpError
	if err == nil || !(errors.As(err, &opErr) || errors.Is(err, io.EOF) || strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "reset")) {
		t.Fatalf("a source outside allow got through: %v", err)
	}
}

// Plain HTTP is refused on an address other machines reach, unless
// plaintext: true; loopback may be plain.
func TestPlaintextOnlyOnLoopbackOrWhenSaid(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  api.Config
		want bool
	}{
		{api.Config{Listen: "0.0.0.0:8443"}, false},
		{api.Config{Listen: ":8443"}, false},
		{api.Config{Listen: "mefor-a.example.org:8443"}, false},
		{api.Config{Listen: "0.0.0.0:8443", Plaintext: true}, true},
		{api.Config{Listen: "127.0.0.1:8443"}, true},
		{api.Config{Listen: "[::1]:8443"}, true},
		{api.Config{Listen: "localhost:8443"}, true},
		{api.Config{Listen: "0.0.0.0:8443", CertFile: "a.crt"}, false},
	} {
		err := c.cfg.Check()
		if (err == nil) != c.want {
			t.Errorf("%+v: %v, want allowed=%v", c.cfg, err, c.want)
		}
		if !c.want && c.cfg.CertFile == "" && !errors.Is(err, api.ErrPlaintextExposed) {
			t.Errorf("%+v: %v is not ErrPlaintextExposed", c.cfg, err)
		}
	}
}
