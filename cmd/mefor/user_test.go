package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/ops"
)

// withStdin runs the CLI on the fixture's database with stdin as standard
// input, without MEFOR_ENCRYPTION_KEYS.
func (f *opsFixture) withStdin(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	return f.withStdinKeys(t, stdin, "", args...)
}

func (f *opsFixture) withStdinKeys(t *testing.T, stdin, keys string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runIO(append(args, "--database-url", f.db.URL), strings.NewReader(stdin), &out, &errb, envWith(keys))
	return code, out.String(), errb.String()
}

// The first admin, as docs/access.md bootstraps it: user add with the
// password on standard input prints the TOTP URI and recovery codes once;
// the other user and token commands work on it, and none of them is open to
// a login without mefor_admin.
func TestUserAndTokenCommands(t *testing.T) {
	t.Parallel()
	f := emptyOpsFixture(t)
	ctx := context.Background()
	const pw = "correct horse battery"

	code, out, errs := f.withStdin(t, pw+"\n", "user", "add", "alice", "--role", "admin", "--password-stdin", "--json")
	if code != 0 {
		t.Fatalf("user add: exit %d\n%s%s", code, out, errs)
	}
	type added struct {
		ops.User
		TOTPURI       string   `json:"totp_uri"`
		RecoveryCodes []string `json:"recovery_codes"`
	}
	a := decode[added](t, out)
	if a.Name != "alice" || a.Role != "admin" || !a.MFA || !strings.HasPrefix(a.TOTPURI, "otpauth://totp/mefor:alice?") ||
		len(a.RecoveryCodes) != 10 {
		t.Fatalf("user add --json: %s", out)
	}
	if strings.Contains(out+errs, pw) {
		t.Fatal("user add echoed the password")
	}
	if !strings.Contains(errs, "the TOTP secret is stored in clear") {
		t.Fatalf("user add without MEFOR_ENCRYPTION_KEYS does not warn:\n%s", errs)
	}
	// With the keys, the secret is sealed, and nothing is said.
	code, _, errs = f.withStdinKeys(t, pw, newKeySpec(t, "k1"), "user", "add", "carol", "--role", "admin", "--password-stdin")
	var stored string
	if err := f.db.Pool.QueryRow(ctx, `SELECT totp_secret FROM mefor_user WHERE name = 'carol'`).Scan(&stored); err != nil || code != 0 ||
		!strings.HasPrefix(stored, crypt.TextHeader("k1")) || strings.Contains(errs, "in clear") {
		t.Fatalf("user add with keys: exit %d, secret stored as %q (%v)\n%s", code, stored, err, errs)
	}
	f.ok(t, "user", "delete", "carol")

	if code, _, errs := f.withStdin(t, pw+"\n", "user", "add", "bob", "--role", "viewer"); code != 1 || !strings.Contains(errs, "--password-stdin") {
		t.Fatalf("user add without --password-stdin: exit %d, %s", code, errs)
	}
	if code, out, errs := f.withStdin(t, "bob\n", "user", "add", "bob", "--role", "viewer", "--password-stdin"); code != 1 ||
		!strings.Contains(errs, "password: must be at least 12 characters") {
		t.Fatalf("a short password: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := f.withStdin(t, pw, "user", "add", "bob", "--role", "viewer", "--channel", "lab-*", "--password-stdin"); code != 0 ||
		!strings.Contains(out, "user bob added: role viewer, channels lab-*") || strings.Contains(out, "TOTP") {
		t.Fatalf("user add bob: exit %d\n%s%s", code, out, errs)
	}

	list := decode[[]ops.User](t, f.ok(t, "user", "list", "--json"))
	if len(list) != 2 || list[0].Name != "alice" || list[1].Name != "bob" || list[1].Channels[0] != "lab-*" {
		t.Fatalf("user list --json: %+v", list)
	}
	if out := f.ok(t, "user", "set", "bob", "--channel", "micro-*", "--channel", "lab-*"); !strings.Contains(out, "channels micro-*,lab-*") {
		t.Fatalf("user set: %s", out)
	}
	f.ok(t, "user", "disable", "bob")
	if out := f.ok(t, "user", "list"); !strings.Contains(out, "disabled") || !strings.Contains(out, "totp") {
		t.Fatalf("user list:\n%s", out)
	}
	f.ok(t, "user", "enable", "bob")
	if out := f.ok(t, "user", "sessions", "bob"); !strings.Contains(out, "no sessions of bob") {
		t.Fatalf("user sessions: %s", out)
	}
	if out := f.ok(t, "user", "sessions", "bob", "--revoke"); !strings.Contains(out, "0 sessions of bob ended") {
		t.Fatalf("user sessions --revoke: %s", out)
	}
	reset := decode[ops.Enrollment](t, f.ok(t, "user", "reset-mfa", "alice", "--json"))
	if reset.TOTPURI == a.TOTPURI || len(reset.RecoveryCodes) != 10 {
		t.Fatalf("reset-mfa gave %+v", reset)
	}

	// token create prints the token alone on stdout, once; only its hash
	// is stored.
	code, out, errs = f.mefor(t, "token", "create", "--user", "bob", "--expires", "30d")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "mefor_t_") || strings.Contains(tok, "\n") || !strings.Contains(errs, "shown only this once") {
		t.Fatalf("token create: exit %d\n%s%s", code, out, errs)
	}
	sum := sha256.Sum256([]byte(tok))
	var id int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT id FROM mefor_api_token WHERE token_hash = $1`, sum[:]).Scan(&id); err != nil {
		t.Fatalf("no token row holds the token's hash: %v", err)
	}
	if out := f.ok(t, "token", "list", "--json"); strings.Contains(out, tok) || !strings.Contains(out, `"user": "bob"`) {
		t.Fatalf("token list --json:\n%s", out)
	}
	if out := f.ok(t, "token", "revoke", "1"); !strings.Contains(out, "token 1 revoked") {
		t.Fatalf("token revoke: %s", out)
	}
	if code, _, errs := f.mefor(t, "token", "revoke", "99"); code != 1 || !strings.Contains(errs, "no token 99") {
		t.Fatalf("token revoke 99: exit %d, %s", code, errs)
	}
	f.ok(t, "user", "delete", "bob")

	// audit list names the person who tried to log in.
	store := identity.New(f.db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	if _, err := store.Login(ctx, identity.LoginRequest{Username: "mallory", Password: "guess guess guess"}); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("mallory's login: %v", err)
	}
	if out := f.ok(t, "audit", "list", "--action", "login"); !strings.Contains(out, "mallory (") {
		t.Fatalf("audit list does not name the actor:\n%s", out)
	}

	// Readers and operators may not read the users, not even through mefor.
	f.ok(t, "migrate")
	for _, role := range []string{migrations.RoleReader, migrations.RoleOperator} {
		_, url := newLogin(t, f.db, role)
		code, _, errs := as(t, url, "user", "list")
		if code != 1 || !strings.Contains(errs, "needs the mefor_admin role") {
			t.Fatalf("user list as %s: exit %d, %s", role, code, errs)
		}
		code, _, errs = as(t, url, "token", "create", "--user", "alice")
		if code != 1 || !strings.Contains(errs, "needs the mefor_admin role") {
			t.Fatalf("token create as %s: exit %d, %s", role, code, errs)
		}
	}
	var n int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_audit WHERE action = 'token-create' AND outcome = 'denied'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d denied token-create rows, %v", n, err)
	}
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_audit WHERE position($1 in target::text) > 0`, pw).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the password is in %d audit rows (%v)", n, err)
	}
}
