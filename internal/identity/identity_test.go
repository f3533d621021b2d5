package identity_test

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

// fixture is a database of the test's own with a Store on it.
type fixture struct {
	*fixtures.DBTest
	store *identity.Store
}

func newFixture(t *testing.T, opts identity.Options) *fixture {
	f := &fixture{DBTest: fixtures.NewDBTest(t)}
	if opts.Argon2 == (identity.Argon2Params{}) {
		opts.Argon2 = cheap
	}
	f.store = identity.New(f.DB.Pool, opts)
	return f
}

const password = "correct horse battery"

// add creates a user with password and returns its enrollment's TOTP
// secret and recovery codes (none for a role without MFA).
func (f *fixture) add(name, role string, channels ...string) (secret string, codes []string) {
	f.T.Helper()
	_, enr, err := f.store.AddUser(f.Ctx, identity.NewUser{Name: name, Role: role, Channels: channels, Password: password})
	if err != nil {
		f.T.Fatal(err)
	}
	if enr == nil {
		return "", nil
	}
	return secretOf(f.T, enr), enr.RecoveryCodes
}

func secretOf(t *testing.T, enr *identity.Enrollment) string {
	t.Helper()
	key, err := otp.NewKeyFromURL(enr.TOTPURI)
	if err != nil || !strings.HasPrefix(enr.TOTPURI, "otpauth://totp/") {
		t.Fatalf("totp_uri %q: %v", enr.TOTPURI, err)
	}
	return key.Secret()
}

func code(t *testing.T, secret string) string {
	t.Helper()
	c, err := identity.TOTPCode(secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) login(name, pw, totp string) (*identity.Login, error) {
	return f.store.Login(f.Ctx, identity.LoginRequest{Username: name, Password: pw, TOTP: totp, Source: "192.0.2.7"})
}

// logins are the login rows of the audit log, oldest first.
func (f *fixture) logins() []map[string]any {
	f.T.Helper()
	recs, err := audit.List(f.Ctx, f.DB.Pool, audit.Filter{Action: audit.ActionLogin})
	if err != nil {
		f.T.Fatal(err)
	}
	var out []map[string]any
	for i := len(recs) - 1; i >= 0; i-- {
		var m map[string]any
		if err := json.Unmarshal(recs[i].Target, &m); err != nil {
			f.T.Fatal(err)
		}
		m["outcome"] = recs[i].Outcome
		m["record_actor"] = recs[i].Actor
		out = append(out, m)
	}
	return out
}

// Five wrong passwords within 15 minutes lock the account: the sixth try,
// with the right password, is refused with the same answer an unknown user
// gets, and every attempt is in the audit log under the name tried.
func TestLockoutAfterFiveFailures(t *testing.T) {
	f := newFixture(t, identity.Options{})
	f.add("alice", identity.RoleViewer)

	_, unknown := f.login("mallory", password, "")
	if !errors.Is(unknown, identity.ErrLoginFailed) {
		t.Fatalf("unknown user: %v", unknown)
	}
	for i := range 5 {
		if _, err := f.login("alice", "wrong password!", ""); !errors.Is(err, identity.ErrLoginFailed) {
			t.Fatalf("wrong password %d: %v", i+1, err)
		}
	}
	_, locked := f.login("alice", password, "")
	if !errors.Is(locked, identity.ErrLoginFailed) {
		t.Fatalf("the sixth login, with the right password, was not refused: %v", locked)
	}
	if locked.Error() != unknown.Error() {
		t.Errorf("a locked account answers %q, an unknown user %q", locked, unknown)
	}

	rows := f.logins()
	if len(rows) != 7 {
		t.Fatalf("%d login rows audited, want 7: %v", len(rows), rows)
	}
	for i, want := range []string{"unknown-user", "password", "password", "password", "password", "password", "locked"} {
		r := rows[i]
		wantActor := "alice"
		if i == 0 {
			wantActor = "mallory"
		}
		if r["actor"] != wantActor || r["record_actor"] != wantActor || r["reason"] != want || r["outcome"] != audit.OutcomeFailed || r["source"] != "192.0.2.7" {
			t.Errorf("login row %d: %v, want actor %s, reason %s, failed", i+1, r, wantActor, want)
		}
	}
	if rows[5]["locked"] != true {
		t.Errorf("the fifth failure's row does not say it locked the account: %v", rows[5])
	}
	// An administrator's enable clears the lock.
	if _, err := f.store.SetDisabled(f.Ctx, "alice", false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.login("alice", password, ""); err != nil {
		t.Fatalf("after enable: %v", err)
	}
}

// Failures spread over more than the window do not lock.
func TestFailuresOutsideTheWindowDoNotLock(t *testing.T) {
	f := newFixture(t, identity.Options{})
	f.add("bob", identity.RoleViewer)
	for range 4 {
		if _, err := f.login("bob", "wrong password!", ""); !errors.Is(err, identity.ErrLoginFailed) {
			t.Fatal(err)
		}
	}
	f.Exec(`UPDATE mefor_user SET failed_since = now() - interval '16 minutes' WHERE name = 'bob'`)
	if _, err := f.login("bob", "wrong password!", ""); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatal(err)
	}
	if _, err := f.login("bob", password, ""); err != nil {
		t.Fatalf("a fifth failure 16 minutes after the first locked the account: %v", err)
	}
}

// An admin needs a TOTP code, and each code works once.
func TestTOTPCodeWorksOnce(t *testing.T) {
	f := newFixture(t, identity.Options{})
	secret, codes := f.add("root", identity.RoleAdmin)
	if secret == "" || len(codes) != identity.RecoveryCodes {
		t.Fatalf("an admin was added without MFA: secret %t, %d recovery codes", secret != "", len(codes))
	}
	if _, err := f.login("root", password, ""); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("an admin logged in without a code: %v", err)
	}
	c := code(t, secret)
	l, err := f.login("root", password, c)
	if err != nil {
		t.Fatalf("password and code: %v", err)
	}
	if l.Principal.Name != "root" || !l.Principal.Can(identity.PermUsers) {
		t.Errorf("principal %+v", l.Principal)
	}
	if _, err := f.login("root", password, c); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("the same code logged in twice: %v", err)
	}
	rows := f.logins()
	if last := rows[len(rows)-1]; last["reason"] != "mfa-code" {
		t.Errorf("the reused code's row: %v", last)
	}
	for _, r := range rows {
		b, _ := json.Marshal(r)
		if strings.Contains(string(b), c) || strings.Contains(string(b), password) {
			t.Errorf("an audit row holds the code or the password: %s", b)
		}
	}
}

// A recovery code stands in for the TOTP code, once.
func TestRecoveryCodeWorksOnce(t *testing.T) {
	f := newFixture(t, identity.Options{})
	_, codes := f.add("root", identity.RoleAdmin)
	if _, err := f.login("root", password, strings.ToUpper(codes[3])); err != nil {
		t.Fatalf("recovery code: %v", err)
	}
	if _, err := f.login("root", password, codes[3]); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("a recovery code worked twice: %v", err)
	}
	if _, err := f.login("root", password, codes[4]); err != nil {
		t.Fatalf("another recovery code: %v", err)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_user_recovery_code WHERE code_hash = ANY($1)`, codes); n != 0 {
		t.Errorf("%d recovery codes stored as they are", n)
	}
	// reset-mfa: the old codes and secret stop working, the new ones work.
	enr, err := f.store.ResetMFA(f.Ctx, "root")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.login("root", password, codes[5]); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("an old recovery code worked after reset-mfa: %v", err)
	}
	if _, err := f.login("root", password, code(t, secretOf(t, enr))); err != nil {
		t.Fatalf("the new secret's code: %v", err)
	}
}

// With MEFOR_ENCRYPTION_KEYS the TOTP secret is sealed in the table.
func TestTOTPSecretIsSealedUnderTheKeys(t *testing.T) {
	kr := fixtures.Keyring(t, "k1")
	f := newFixture(t, identity.Options{Keys: kr})
	secret, _ := f.add("root", identity.RoleAdmin)
	var stored string
	if err := f.DB.Pool.QueryRow(f.Ctx, `SELECT totp_secret FROM mefor_user WHERE name = 'root'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stored, crypt.TextHeader("k1")) || strings.Contains(stored, secret) {
		t.Fatalf("the TOTP secret is stored as %q", stored)
	}
	if _, err := f.login("root", password, code(t, secret)); err != nil {
		t.Fatal(err)
	}

	// The sealed secret is bound to its user's row: copied onto another
	// admin's row it does not open, so root's codes do not log in as bob.
	f.add("bob", identity.RoleAdmin)
	if _, err := f.DB.Pool.Exec(f.Ctx, `UPDATE mefor_user SET totp_secret = $1, totp_last_step = 0 WHERE name = 'bob'`, stored); err != nil {
		t.Fatal(err)
	}
	if l, err := f.login("bob", password, code(t, secret)); err == nil {
		t.Fatalf("bob logged in with root's copied TOTP secret: %+v", l)
	}
}

// A token is shown once: the table holds only its SHA-256. It acts as its
// user until revoked, expired, or the user is disabled.
func TestTokenShownOnceAndOnlyItsHashStored(t *testing.T) {
	f := newFixture(t, identity.Options{})
	f.add("ci", identity.RoleOperator, "lab-*")
	tok, secret, err := f.store.CreateToken(f.Ctx, "ci", 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(secret))
	if n := f.Int(`SELECT count(*) FROM mefor_api_token WHERE id = $1 AND token_hash = $2`, tok.ID, sum[:]); n != 1 {
		t.Fatal("the token's row does not hold its SHA-256")
	}
	if n := f.Int(`SELECT count(*) FROM mefor_api_token t WHERE position($1 in t::text) > 0
		OR position(convert_to($1, 'UTF8') in t.token_hash) > 0`, secret); n != 0 {
		t.Fatal("the token is stored as it is")
	}
	p, err := f.store.TokenPrincipal(f.Ctx, secret)
	if err != nil || p.Name != "ci" || p.TokenID != tok.ID || !p.SeesChannel("lab-a") || p.SeesChannel("adt") {
		t.Fatalf("token principal %+v, %v", p, err)
	}
	list, err := f.store.ListTokens(f.Ctx)
	if err != nil || len(list) != 1 || list[0].ExpiresAt == nil {
		t.Fatalf("token list %+v, %v", list, err)
	}
	b, _ := json.Marshal(list)
	if strings.Contains(string(b), secret) {
		t.Fatal("token list shows the secret")
	}

	if _, err := f.store.SetDisabled(f.Ctx, "ci", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.TokenPrincipal(f.Ctx, secret); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a disabled user's token: %v", err)
	}
	if _, err := f.store.SetDisabled(f.Ctx, "ci", false); err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeToken(f.Ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.TokenPrincipal(f.Ctx, secret); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a revoked token: %v", err)
	}

	_, other, err := f.store.CreateToken(f.Ctx, "ci", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.Exec(`UPDATE mefor_api_token SET expires_at = now() - interval '1 second' WHERE revoked_at IS NULL`)
	if _, err := f.store.TokenPrincipal(f.Ctx, other); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("an expired token: %v", err)
	}
}

// Disabling a user, or changing their role or channels, ends their
// sessions; a session's token is stored only hashed.
func TestDisabledUsersSessionRefused(t *testing.T) {
	f := newFixture(t, identity.Options{})
	f.add("carol", identity.RoleOperator)
	session := func() string {
		l, err := f.login("carol", password, "")
		if err != nil {
			t.Fatal(err)
		}
		if p, err := f.store.SessionPrincipal(f.Ctx, l.Token); err != nil || p.Name != "carol" {
			t.Fatalf("fresh session: %+v, %v", p, err)
		}
		return l.Token
	}
	tok := session()
	if n := f.Int(`SELECT count(*) FROM mefor_session s WHERE position($1 in s::text) > 0`, tok); n != 0 {
		t.Fatal("the session token is stored as it is")
	}
	if _, err := f.store.SetDisabled(f.Ctx, "carol", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a disabled user's session: %v", err)
	}
	if _, err := f.login("carol", password, ""); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("a disabled user logged in: %v", err)
	}
	if _, err := f.store.SetDisabled(f.Ctx, "carol", false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a session survived its user's disable and enable: %v", err)
	}

	tok = session()
	channels := []string{"lab-*"}
	if _, _, err := f.store.SetUser(f.Ctx, "carol", identity.Change{Channels: &channels}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a session survived a change of channels: %v", err)
	}

	tok = session()
	f.Exec(`UPDATE mefor_session SET last_seen_at = now() - interval '31 minutes'`)
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a session idle past api.session_idle: %v", err)
	}
	tok = session()
	f.Exec(`UPDATE mefor_session SET expires_at = now() - interval '1 second'`)
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a session past api.session_max: %v", err)
	}

	tok = session()
	if err := f.store.Logout(f.Ctx, tok, "192.0.2.7"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SessionPrincipal(f.Ctx, tok); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a session after logout: %v", err)
	}
}

// A new user is refused a short password, its own name as password, an
// unknown role and a bad channel pattern; the password is stored only as
// an argon2id hash, and the audit log records the change without it.
func TestAddUserChecksAndStoresOnlyTheHash(t *testing.T) {
	f := newFixture(t, identity.Options{})
	for _, c := range []struct {
		u     identity.NewUser
		field string
	}{
		{identity.NewUser{Name: "dave", Role: "viewer", Password: "too short"}, "password"},
		{identity.NewUser{Name: "dave.smith.x", Role: "viewer", Password: "Dave.Smith.X"}, "password"},
		{identity.NewUser{Name: "dave", Role: "superuser", Password: password}, "role"},
		{identity.NewUser{Name: "dave", Role: "viewer", Channels: []string{"lab-["}, Password: password}, "channel"},
		{identity.NewUser{Name: "Dave", Role: "viewer", Password: password}, "name"},
	} {
		_, _, err := f.store.AddUser(f.Ctx, c.u)
		if ie, ok := identity.IsInvalid(err); !ok || ie.Field != c.field {
			t.Errorf("%+v: %v, want refused naming %s", c.u.Name, err, c.field)
		}
	}
	u, enr, err := f.store.AddUser(f.Ctx, identity.NewUser{Name: "dave", Role: "viewer", Password: password})
	if err != nil || enr != nil || u.MFA {
		t.Fatalf("add viewer: %+v, %+v, %v", u, enr, err)
	}
	if _, _, err := f.store.AddUser(f.Ctx, identity.NewUser{Name: "dave", Role: "viewer", Password: password}); err == nil {
		t.Fatal("a second dave was added")
	}
	var hash string
	if err := f.DB.Pool.QueryRow(f.Ctx, `SELECT password_hash FROM mefor_user WHERE name = 'dave'`).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, "$argon2id$") || strings.Contains(hash, password) {
		t.Fatalf("password stored as %q", hash)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'user-add' AND outcome = 'ok' AND target::jsonb->>'user' = 'dave'`); n != 1 {
		t.Errorf("%d user-add rows for dave", n)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_audit WHERE position($1 in target::text) > 0`, password); n != 0 {
		t.Errorf("the password is in %d audit rows", n)
	}
	// Becoming an admin enrolls MFA.
	admin := identity.RoleAdmin
	if _, enr, err := f.store.SetUser(f.Ctx, "dave", identity.Change{Role: &admin}); err != nil || enr == nil {
		t.Fatalf("dave made admin: enrollment %v, %v", enr, err)
	}
	if _, err := f.login("dave", password, ""); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("dave logged in as admin without a code: %v", err)
	}
	if err := f.store.DeleteUser(f.Ctx, "dave"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.DeleteUser(f.Ctx, "dave"); !identity.IsNotFound(err) {
		t.Fatalf("deleting dave twice: %v", err)
	}
}

// An unknown user's, a disabled user's and a locked account's logins
// hash the password as a known user's does, so the time of the answer
// does not tell them apart.
func TestEveryRefusalHashesThePassword(t *testing.T) {
	f := newFixture(t, identity.Options{})
	f.add("erin", identity.RoleViewer)
	f.add("frank", identity.RoleViewer)
	if _, err := f.store.SetDisabled(f.Ctx, "frank", true); err != nil {
		t.Fatal(err)
	}
	var n int
	identity.CountVerifies(f.store, &n)
	for _, name := range []string{"nobody", "frank", "erin"} {
		n = 0
		if _, err := f.login(name, "wrong password!", ""); !errors.Is(err, identity.ErrLoginFailed) {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("the login of %s hashed the password %d times, want 1", name, n)
		}
	}
}
