package api_test

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
)

// admin is a logged-in admin's session: the cookie, its CSRF header and
// the TOTP secret to re-authenticate with.
type admin struct {
	cookie *http.Cookie
	csrf   map[string]string
	secret string
	id     float64 // the session's id, as GET /api/v1/me answers it
}

// loginAdmin adds name as an admin and logs them in.
func (h *harness) loginAdmin(name string) admin {
	h.T.Helper()
	secret := h.add(name, identity.RoleAdmin)
	cookie, csrf := h.login(name, secret)
	_, me, _ := h.call("GET", "/api/v1/me", nil, nil, cookie)
	return admin{cookie: cookie, csrf: csrf, secret: secret, id: me["session_id"].(float64)}
}

// as calls the API in a's session.
func (h *harness) as(a admin, method, path string, body any) (int, map[string]any) {
	h.T.Helper()
	status, res, _ := h.call(method, path, body, a.csrf, a.cookie)
	return status, res
}

// reauth re-authenticates a's session with password and the next TOTP
// step's code (the login used the current one).
func (h *harness) reauth(a admin) {
	h.T.Helper()
	h.clock.Advance(30 * time.Second)
	code, _ := identity.TOTPCode(a.secret, h.clock.Now())
	if status, e := h.as(a, "POST", "/api/v1/reauth", map[string]string{"password": password, "totp": code}); status != http.StatusOK {
		h.T.Fatalf("re-authentication: %d %v", status, e)
	}
}

func refusedForReauth(status int, e map[string]any) bool {
	return status == http.StatusForbidden && e["permission"] == "reauth" && strings.Contains(fmt.Sprint(e["error"]), "/api/v1/reauth")
}

// step is one user or token change through the API.
type step struct {
	method, path string
	body         any
}

// Every user and token change is refused 403 "reauth" without a fresh
// re-authentication, changing nothing; is allowed within the window, each
// with the answer a person acts on; and is refused again once the window
// has passed (the clock is moved, not waited for).
func TestUserAndTokenChangesNeedAFreshReauthentication(t *testing.T) {
	h := newHarness(t, api.Config{})
	alice := h.loginAdmin("alice")
	h.add("bob", identity.RoleOperator)
	tomToken := h.user("tom", identity.RoleViewer) // a token to revoke
	_, list, _ := h.call("GET", "/api/v1/tokens", nil, h.user("root", identity.RoleAdmin))
	var tomID float64
	for _, tk := range list["tokens"].([]any) {
		if tk.(map[string]any)["user"] == "tom" {
			tomID = tk.(map[string]any)["id"].(float64)
		}
	}
	changes := []step{
		{"POST", "/api/v1/users", map[string]any{"name": "carol", "role": "admin", "password": password}},
		{"PATCH", "/api/v1/users/bob", map[string]any{"role": "viewer", "channels": []string{"lab-*"}}},
		{"POST", "/api/v1/users/bob/disable", nil},
		{"POST", "/api/v1/users/bob/enable", nil},
		{"POST", "/api/v1/users/bob/reset-mfa", nil},
		{"DELETE", "/api/v1/users/bob/sessions", nil},
		{"POST", "/api/v1/tokens", map[string]any{"user": "bob", "expires": "1d"}},
		{"DELETE", fmt.Sprintf("/api/v1/tokens/%d", int64(tomID)), nil},
		{"DELETE", "/api/v1/users/bob", nil},
	}
	for _, c := range changes {
		if status, e := h.as(alice, c.method, c.path, c.body); !refusedForReauth(status, e) {
			t.Fatalf("%s %s without a re-authentication: %d %v", c.method, c.path, status, e)
		}
	}
	if n := h.Int(`SELECT count(*) FROM mefor_user WHERE name IN ('carol', 'bob')`); n != 1 {
		t.Fatalf("%d of carol and bob exist after the refused changes, want bob alone", n)
	}
	if status, _, _ := h.call("GET", "/api/v1/me", nil, tomToken); status != http.StatusOK {
		t.Fatalf("tom's token after a refused revocation: %d", status)
	}

	h.reauth(alice)
	answers := map[string]map[string]any{}
	for _, c := range changes {
		status, res := h.as(alice, c.method, c.path, c.body)
		if status != http.StatusOK && status != http.StatusCreated {
			t.Fatalf("%s %s within the window: %d %v", c.method, c.path, status, res)
		}
		answers[c.method+" "+c.path] = res
	}
	carol := answers["POST /api/v1/users"]
	if uri, _ := carol["totp_uri"].(string); !strings.HasPrefix(uri, "otpauth://") || len(carol["recovery_codes"].([]any)) != 10 || carol["role"] != "admin" {
		t.Fatalf("adding an admin: %v", carol)
	}
	if set := answers["PATCH /api/v1/users/bob"]; set["role"] != "viewer" || fmt.Sprint(set["channels"]) != "[lab-*]" {
		t.Fatalf("changing bob: %v", set)
	}
	if mfa := answers["POST /api/v1/users/bob/reset-mfa"]; !strings.HasPrefix(fmt.Sprint(mfa["totp_uri"]), "otpauth://") {
		t.Fatalf("resetting bob's MFA: %v", mfa)
	}
	tok := answers["POST /api/v1/tokens"]
	if secret, _ := tok["token"].(string); !strings.HasPrefix(secret, "mefor_t_") || tok["user"] != "bob" || tok["expires_at"] == nil {
		t.Fatalf("creating a token: %v", tok)
	}
	if status, _, _ := h.call("GET", "/api/v1/me", nil, tomToken); status != http.StatusUnauthorized {
		t.Fatalf("tom's token after its revocation through the API: %d", status)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_user WHERE name = 'bob'`); n != 0 {
		t.Fatalf("bob still exists after his deletion")
	}

	h.clock.Advance(identity.ReauthWindow + time.Second)
	if status, e := h.as(alice, "POST", "/api/v1/users", map[string]any{"name": "dave", "role": "viewer", "password": password}); !refusedForReauth(status, e) {
		t.Fatalf("adding a user past the window: %d %v", status, e)
	}
	if status, e := h.as(alice, "POST", "/api/v1/tokens", map[string]any{"user": "carol"}); !refusedForReauth(status, e) {
		t.Fatalf("creating a token past the window: %d %v", status, e)
	}
}

// An API token cannot re-authenticate, so an admin's token changes no
// user and creates no token; an operator is refused naming the permission
// it lacks, before any re-authentication question.
func TestUserAndTokenChangesRefusedToTokensAndOperators(t *testing.T) {
	h := newHarness(t, api.Config{})
	root := h.user("root", identity.RoleAdmin)
	if status, e, _ := h.call("POST", "/api/v1/users", map[string]any{"name": "carol", "role": "viewer", "password": password}, root); !refusedForReauth(status, e) {
		t.Fatalf("adding a user with an admin's API token: %d %v", status, e)
	}
	olga := h.user("olga", identity.RoleOperator)
	for _, c := range []struct {
		step
		perm string
	}{
		{step{"POST", "/api/v1/users", map[string]any{"name": "carol", "role": "admin", "password": password}}, "users"},
		{step{"PATCH", "/api/v1/users/olga", map[string]any{"role": "admin"}}, "users"},
		{step{"GET", "/api/v1/users/olga/sessions", nil}, "users"},
		{step{"GET", "/api/v1/tokens", nil}, "tokens"},
		{step{"POST", "/api/v1/tokens", map[string]any{"user": "root"}}, "tokens"},
		{step{"POST", "/api/v1/keys/rotate", nil}, "keys.rotate"},
	} {
		if status, e, _ := h.call(c.method, c.path, c.body, olga); status != http.StatusForbidden || e["permission"] != c.perm {
			t.Fatalf("an operator's %s %s: %d %v, want 403 naming %s", c.method, c.path, status, e, c.perm)
		}
	}
	if n := h.Int(`SELECT count(*) FROM mefor_user WHERE name = 'carol' OR (name = 'olga' AND role <> 'operator')`); n != 0 {
		t.Fatalf("a refused change changed %d users", n)
	}
}

// A user change and a token creation through the API are audited with the
// person as actor, their address and their session; a refused value is a
// 422 naming its field, an unknown user a 404.
func TestUserAndTokenChangesAreAuditedWithThePerson(t *testing.T) {
	h := newHarness(t, api.Config{})
	alice := h.loginAdmin("alice")
	h.reauth(alice)
	if status, res := h.as(alice, "POST", "/api/v1/users", map[string]any{"name": "bob", "role": "operator", "channels": []string{"lab-*"}, "password": password}); status != http.StatusCreated ||
		res["totp_uri"] != nil {
		t.Fatalf("adding an operator: %d %v", status, res)
	}
	status, tok := h.as(alice, "POST", "/api/v1/tokens", map[string]any{"user": "bob"})
	if status != http.StatusCreated {
		t.Fatalf("creating a token: %d %v", status, tok)
	}
	for action, extra := range map[string]string{"user-add": `'user', 'bob'`, "token-create": `'token_id', ` + fmt.Sprint(tok["id"])} {
		if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = $1 AND outcome = 'ok'
			AND target::jsonb @> jsonb_build_object('actor', 'alice', 'source', '127.0.0.1', 'session_id', $2::bigint, `+extra+`)`, action, int64(alice.id)); n != 1 {
			t.Errorf("%d %s rows naming alice, her address and session", n, action)
		}
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE target::jsonb ? 'token' OR target::text LIKE '%' || $1 || '%'`, tok["token"]); n != 0 {
		t.Errorf("%d audit rows hold the new token", n)
	}

	if status, e := h.as(alice, "POST", "/api/v1/users", map[string]any{"name": "carol", "role": "viewer", "password": "short"}); status != http.StatusUnprocessableEntity || e["field"] != "password" {
		t.Fatalf("a short password: %d %v", status, e)
	}
	if status, e := h.as(alice, "PATCH", "/api/v1/users/bob", map[string]any{"role": "superuser"}); status != http.StatusUnprocessableEntity || e["field"] != "role" {
		t.Fatalf("an unknown role: %d %v", status, e)
	}
	if status, e := h.as(alice, "POST", "/api/v1/tokens", map[string]any{"user": "bob", "expires": "soon"}); status != http.StatusUnprocessableEntity || e["field"] != "expires" {
		t.Fatalf("a bad expiry: %d %v", status, e)
	}
	if status, e := h.as(alice, "POST", "/api/v1/users/nobody/disable", nil); status != http.StatusNotFound {
		t.Fatalf("disabling an unknown user: %d %v", status, e)
	}
}

// A role change through the API ends the user's sessions, as the CLI's
// does: their next request is 401.
func TestRoleChangeThroughTheAPIEndsTheirSessions(t *testing.T) {
	h := newHarness(t, api.Config{})
	alice := h.loginAdmin("alice")
	h.add("bob", identity.RoleOperator)
	status, _, resp := h.call("POST", "/api/v1/login", map[string]string{"username": "bob", "password": password}, nil)
	if status != http.StatusOK {
		t.Fatalf("bob's login: %d", status)
	}
	bob := sessionCookie(t, resp)
	h.reauth(alice)
	if status, _ := h.as(alice, "GET", "/api/v1/users/bob/sessions", nil); status != http.StatusOK {
		t.Fatalf("bob's sessions: %d", status)
	}
	if status, res := h.as(alice, "PATCH", "/api/v1/users/bob", map[string]any{"channels": []string{"lab-*"}}); status != http.StatusOK {
		t.Fatalf("changing bob's channels: %d %v", status, res)
	}
	if status, _, _ := h.call("GET", "/api/v1/me", nil, nil, bob); status != http.StatusUnauthorized {
		t.Fatalf("bob's session after his channels changed: %d", status)
	}
}

func keySpec(t *testing.T, id string) string {
	t.Helper()
	b := make([]byte, crypt.KeySize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return id + "=" + base64.StdEncoding.EncodeToString(b)
}

func keyring(t *testing.T, spec string) *crypt.Keyring {
	t.Helper()
	kr, err := crypt.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// POST /api/v1/keys/rotate re-seals, with the node's keyring, what older
// keys sealed: refused without a fresh re-authentication, and afterwards
// keys status counts every value under the active key.
func TestKeysRotateThroughTheAPI(t *testing.T) {
	k1, k2 := keySpec(t, "k1"), keySpec(t, "k2")
	ring := keyring(t, k2+","+k1)
	h := newKeyedHarness(t, api.Config{}, ring)
	// Messages stored while k1 was the active key.
	h.keys = keyring(t, k1)
	for _, c := range []string{"lab-a", "adt"} {
		h.receive(c, "P-"+c)
	}
	h.keys = ring
	before, err := ops.KeysStatus(h.Ctx, h.DB.Pool, ring)
	if err != nil {
		t.Fatal(err)
	}
	if before.ByKey["k1"] == 0 || before.Pending != before.ByKey["k1"] {
		t.Fatalf("before the rotation: %+v", before)
	}

	alice := h.loginAdmin("alice")
	if status, e := h.as(alice, "POST", "/api/v1/keys/rotate", nil); !refusedForReauth(status, e) {
		t.Fatalf("keys rotate without a re-authentication: %d %v", status, e)
	}
	if st, _ := ops.KeysStatus(h.Ctx, h.DB.Pool, ring); st.ByKey["k1"] != before.ByKey["k1"] {
		t.Fatalf("a refused rotation moved values: %+v", st)
	}
	h.reauth(alice)
	status, res := h.as(alice, "POST", "/api/v1/keys/rotate", nil)
	if status != http.StatusOK || res["left"] != float64(0) || res["total"] != float64(before.Pending) {
		t.Fatalf("keys rotate: %d %v", status, res)
	}
	after, err := ops.KeysStatus(h.Ctx, h.DB.Pool, ring)
	if err != nil {
		t.Fatal(err)
	}
	if after.ByKey["k1"] != 0 || after.ByKey["k2"] != before.ByKey["k1"] || after.Pending != 0 {
		t.Fatalf("after the rotation: %+v", after)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'keys-rotate' AND outcome = 'ok'
		AND target::jsonb @> jsonb_build_object('actor', 'alice', 'session_id', $1::bigint)`, int64(alice.id)); n == 0 {
		t.Error("no keys-rotate row names alice and her session")
	}
}

// With access.approvals naming keys.rotate, a rotation waits for a second
// person: 202 with its approval_id, nothing re-sealed until another admin,
// re-authenticated, approves it.
func TestKeysRotateUnderDualControl(t *testing.T) {
	k1, k2 := keySpec(t, "k1"), keySpec(t, "k2")
	ring := keyring(t, k2+","+k1)
	h := newKeyedHarness(t, api.Config{Approvals: api.Approvals{RequiredFor: []identity.Permission{identity.PermKeysRotate}}}, ring)
	h.keys = keyring(t, k1)
	h.receive("lab-a", "P-1")
	h.keys = ring

	alice, bert := h.loginAdmin("alice"), h.loginAdmin("bert")
	h.reauth(alice)
	status, res := h.as(alice, "POST", "/api/v1/keys/rotate", nil)
	id := approvalID(t, status, res)
	if st, _ := ops.KeysStatus(h.Ctx, h.DB.Pool, ring); st.Pending == 0 {
		t.Fatal("the rotation ran before its approval")
	}
	h.reauth(bert)
	if status, res := h.as(bert, "POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil); status != http.StatusOK {
		t.Fatalf("approving the rotation: %d %v", status, res)
	}
	if st, _ := ops.KeysStatus(h.Ctx, h.DB.Pool, ring); st.Pending != 0 || st.ByKey["k1"] != 0 {
		t.Fatalf("after the approved rotation: %+v", st)
	}
}

// With access.approvals naming users, a user change through the API is
// refused (a second person would see the new password), not run without
// the approval.
func TestUserChangeUnderDualControlIsRefusedNotSkipped(t *testing.T) {
	h := newHarness(t, api.Config{Approvals: api.Approvals{RequiredFor: []identity.Permission{identity.PermUsers}}})
	alice := h.loginAdmin("alice")
	h.reauth(alice)
	if status, e := h.as(alice, "POST", "/api/v1/users", map[string]any{"name": "carol", "role": "viewer", "password": password}); status != http.StatusConflict ||
		e["permission"] != "dual-control" {
		t.Fatalf("adding a user under dual control: %d %v", status, e)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_user WHERE name = 'carol'`); n != 0 {
		t.Fatal("carol was added without an approval")
	}
}
