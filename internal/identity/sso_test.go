package identity_test

import (
	"reflect"
	"testing"

	"github.com/mefor/mefor/internal/identity"
)

// Group mapping rules: the channels of a person's mapped groups add up
// (a group without channels sees every channel, and so then does the
// person); groups giving different roles are refused rather than guessed
// at; a disabled person is refused; a name that belongs to a password user
// is refused, so the directory cannot take over a local account. Each
// refusal is audited with its reason and the person's name.
func TestSSOGroupMappingRules(t *testing.T) {
	f := newFixture(t, identity.Options{Roles: map[string]identity.Role{
		"lab-lead": {Name: "lab-lead", Permissions: []identity.Permission{identity.PermStatus, identity.PermReplay}},
	}, Groups: map[string]identity.GroupMapping{
		"lab":   {Role: identity.RoleViewer, Channels: []string{"lab-*"}},
		"micro": {Role: identity.RoleViewer, Channels: []string{"micro-*", "lab-*"}},
		"all":   {Role: identity.RoleViewer},
		"leads": {Role: "lab-lead", Channels: []string{"lab-*"}},
	}})
	login := func(sub, name string, groups ...string) (*identity.Login, error) {
		return f.store.SSOLogin(f.Ctx, identity.SSOIdentity{Issuer: "https://idp.example.org", Subject: sub, Name: name, Groups: groups, Source: "192.0.2.9"})
	}
	refusedFor := func(err error, reason string) {
		t.Helper()
		r, ok := identity.IsSSORefused(err)
		if !ok || r.Reason != reason {
			t.Fatalf("got %v, want a refusal for %s", err, reason)
		}
		rows := f.logins()
		last := rows[len(rows)-1]
		if last["reason"] != reason || last["method"] != "sso" || last["outcome"] != "failed" {
			t.Fatalf("audit row %v, want reason %s", last, reason)
		}
	}

	l, err := login("s1", "Vera", "lab", "micro", "unmapped")
	if err != nil {
		t.Fatal(err)
	}
	if l.Principal.Name != "vera" || l.Principal.Role.Name != identity.RoleViewer || !reflect.DeepEqual(l.Principal.Channels, []string{"lab-*", "micro-*"}) {
		t.Fatalf("two groups: %+v", l.Principal)
	}
	users, err := f.store.ListUsers(f.Ctx)
	if err != nil || len(users) != 1 || !users[0].SSO || users[0].MFA || users[0].Name != "vera" {
		t.Fatalf("the SSO user in the list: %v %+v", err, users)
	}
	if l, err = login("s1", "vera", "lab", "all"); err != nil || len(l.Principal.Channels) != 0 {
		t.Fatalf("a group of every channel: %v %+v", err, l)
	}
	if l, err = login("s2", "lea", "leads"); err != nil || !l.Principal.Can(identity.PermReplay) {
		t.Fatalf("a custom role through a group: %v %+v", err, l)
	}

	_, err = login("s1", "vera", "lab", "leads")
	refusedFor(err, identity.ReasonSSOAmbiguous)
	_, err = login("s3", "nobody", "unmapped")
	refusedFor(err, identity.ReasonSSONoGroup)

	f.add("paula", identity.RoleViewer)
	_, err = login("s4", "paula", "all")
	refusedFor(err, identity.ReasonSSONameTaken)
	if _, err := f.login("paula", password, ""); err != nil {
		t.Fatalf("the password user after the directory tried her name: %v", err)
	}

	if _, err := f.store.SetDisabled(f.Ctx, "vera", true); err != nil {
		t.Fatal(err)
	}
	_, err = login("s1", "vera", "lab")
	refusedFor(err, identity.ReasonSSODisabled)
}
