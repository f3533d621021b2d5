package identity_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/identity"
)

// The built-in roles are the table: a viewer sees no content, an
// operator acts on messages, an admin does everything and always needs MFA.
func TestBuiltinRoles(t *testing.T) {
	t.Parallel()
	viewer, operator, admin := identity.BuiltinRoles["viewer"], identity.BuiltinRoles["operator"], identity.BuiltinRoles["admin"]
	for _, p := range []identity.Permission{identity.PermStatus, identity.PermNodes, identity.PermMessagesRead, identity.PermDeadRead, identity.PermAlertsRead} {
		if !viewer.Has(p) || !operator.Has(p) || !admin.Has(p) {
			t.Errorf("%s is not held by every role", p)
		}
	}
	for _, p := range []identity.Permission{identity.PermMessagesBody, identity.PermReplay, identity.PermReplayDead, identity.PermCancel, identity.PermEnqueue} {
		if viewer.Has(p) || !operator.Has(p) {
			t.Errorf("%s: viewer %v, operator %v; want operator only", p, viewer.Has(p), operator.Has(p))
		}
	}
	for _, p := range []identity.Permission{identity.PermStepdown, identity.PermReload, identity.PermMaintenanceRun, identity.PermKeysRotate, identity.PermUsers, identity.PermTokens} {
		if operator.Has(p) || !admin.Has(p) {
			t.Errorf("%s: operator %v, admin %v; want admin only", p, operator.Has(p), admin.Has(p))
		}
	}
	if !admin.RequireMFA || viewer.RequireMFA || operator.RequireMFA {
		t.Error("only admin requires MFA by default")
	}
	if _, err := identity.NewRole("lab-lead", []string{"status", "messages.read", "replay"}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.NewRole("lab-lead", []string{"replay", "delete-everything"}, false); err == nil {
		t.Error("a custom role with an unknown permission was accepted")
	}
	// A role that can give anyone any role is as strong as admin: MFA.
	for _, p := range []string{"users", "tokens"} {
		if _, err := identity.NewRole("boss", []string{"status", p}, false); err == nil {
			t.Errorf("a custom role holding %s without MFA was accepted", p)
		} else if ie, ok := identity.IsInvalid(err); !ok || ie.Field != "require_mfa" {
			t.Errorf("a custom role holding %s without MFA: %v", p, err)
		}
		if r, err := identity.NewRole("boss", []string{"status", p}, true); err != nil || !r.RequireMFA {
			t.Errorf("a custom role holding %s with MFA: %v %+v", p, err, r)
		}
	}
	if _, err := identity.NewRole("admin", nil, false); err == nil {
		t.Error("a custom role redefining admin was accepted")
	}
}

// docs/access.md's permission table lists exactly the permissions custom
// roles may use.
func TestPermissionTableIsTheCode(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/access.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| permission | allows |")
	if !ok {
		t.Fatal("docs/access.md has no permission table")
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z.-]+)` \\|")
	var documented []identity.Permission
	for _, m := range row.FindAllStringSubmatch(strings.SplitN(table, "\n\n", 2)[0], -1) {
		documented = append(documented, identity.Permission(m[1]))
	}
	if !slices.Equal(documented, identity.Permissions) {
		t.Fatalf("docs/access.md lists %v, the code %v", documented, identity.Permissions)
	}
}
