package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mefor/mefor/ops"
)

// user add and user set accept a custom role of the config's access.roles
// when given the file (--config), and refuse one otherwise, saying what to
// give; a custom role holding users enrolls MFA as admin does.
func TestUserCommandsTakeCustomRolesFromTheConfig(t *testing.T) {
	t.Parallel()
	f := emptyOpsFixture(t)
	const pw = "correct horse battery"
	file := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(file, []byte(`
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
access:
  roles:
    lab-lead: {permissions: [status, messages.read, messages.body, replay]}
    user-admin: {permissions: [status, users]}
`), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errs := f.withStdin(t, pw+"\n", "user", "add", "lena", "--role", "lab-lead", "--password-stdin")
	if code == 0 || !strings.Contains(errs, `role "lab-lead" is not built in`) || !strings.Contains(errs, "give --config FILE") {
		t.Fatalf("a custom role without --config: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = f.withStdin(t, pw+"\n", "user", "add", "lena", "--role", "lab-lead", "--config", file, "--channel", "lab-*", "--password-stdin", "--json")
	if code != 0 {
		t.Fatalf("user add --role lab-lead --config: exit %d\n%s%s", code, out, errs)
	}
	if u := decode[ops.User](t, out); u.Role != "lab-lead" || u.MFA {
		t.Fatalf("lena: %s", out)
	}
	code, out, errs = f.withStdin(t, pw+"\n", "user", "add", "ulf", "--role", "user-admin", "--config", file, "--password-stdin")
	if code != 0 || !strings.Contains(out, "otpauth://totp/mefor:ulf?") {
		t.Fatalf("a custom role holding users enrolls MFA: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = f.withStdin(t, "", "user", "set", "lena", "--role", "lab-boss", "--config", file)
	if code == 0 || !strings.Contains(errs, `unknown role "lab-boss"`) || !strings.Contains(errs, "lab-lead") {
		t.Fatalf("a role the config does not define: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs = f.withStdin(t, "", "user", "set", "lena", "--role", "viewer"); code != 0 {
		t.Fatalf("a built-in role needs no config: exit %d\n%s%s", code, out, errs)
	}
}
