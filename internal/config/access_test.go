package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/identity"
)

const accessBase = `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`

const goodSSO = `
api:
  listen: 127.0.0.1:8080
  sso:
    oidc:
      issuer: https://login.example.org/realms/hospital
      client_id: mefor
      client_secret: "${OIDC_SECRET}"
      redirect_url: https://mefor.example.org:8443/api/v1/sso/callback
      require_amr: [mfa, otp]
`

// Custom roles and group mappings: accepted as documented, and each
// mistake named at its field with what to write instead.
func TestAccessSection(t *testing.T) {
	env := map[string]string{"OIDC_SECRET": "s3cret-from-env"}
	c, err := parse(t, accessBase+goodSSO+`
access:
  roles:
    lab-lead: {permissions: [status, messages.read, messages.body, replay]}
    user-admin: {permissions: [status, users]}
  groups:
    "/lab/analysts": {role: viewer, channels: ["lab-*"]}
    3f2a9c1e-0000-4bcd-9e1f-1234567890ab: {role: lab-lead}
`, env)
	if err != nil {
		t.Fatal(err)
	}
	lead := c.Access.Roles["lab-lead"]
	if lead.RequireMFA || !lead.Has(identity.PermReplay) || lead.Has(identity.PermUsers) {
		t.Errorf("lab-lead: %+v", lead)
	}
	if !c.Access.Roles["user-admin"].RequireMFA {
		t.Error("a role holding users does not require MFA by default")
	}
	if g := c.Access.Groups["/lab/analysts"]; g.Role != "viewer" || !reflect.DeepEqual(g.Channels, []string{"lab-*"}) {
		t.Errorf("group mapping: %+v", g)
	}
	o := c.API.SSO.OIDC
	if o.ClientSecret != "s3cret-from-env" || o.ClientSecretVar != "OIDC_SECRET" || o.GroupsClaim != "groups" ||
		!reflect.DeepEqual(o.Scopes, []string{"profile", "email"}) || !reflect.DeepEqual(o.RequireAMR, []string{"mfa", "otp"}) {
		t.Errorf("oidc: %+v", o)
	}
	if got := c.OutboundHosts(); !reflect.DeepEqual(got, []string{"127.0.0.1", "login.example.org"}) {
		t.Errorf("outbound hosts %v: the issuer is not listed with the destinations", got)
	}

	groups := "\naccess:\n  groups:\n    staff: {role: viewer}\n"
	for _, tt := range []struct {
		doc   string
		env   map[string]string
		field string
		says  string
	}{
		{doc: "access:\n  roles:\n    lab-lead: {permissions: [status, delete-everything]}\n",
			field: `access.roles["lab-lead"].permissions`, says: `unknown permission "delete-everything"`},
		{doc: "access:\n  roles:\n    lab-lead: {require_mfa: true}\n", field: `access.roles["lab-lead"].permissions`, says: "is required"},
		{doc: "access:\n  roles:\n    admin: {permissions: [status]}\n", field: `access.roles["admin"]`, says: "admin is a built-in role"},
		{doc: "access:\n  roles:\n    boss: {permissions: [users], require_mfa: false}\n", field: `access.roles["boss"].require_mfa`, says: "requires MFA as admin does"},
		{doc: "access:\n  groups:\n    staff: {role: superuser}\n", field: `access.groups["staff"].role`, says: `"superuser", which is neither built in nor in access.roles`},
		{doc: "access:\n  groups:\n    staff: {channels: [lab-*]}\n", field: `access.groups["staff"].role`, says: "is required"},
		{doc: "access:\n  groups:\n    staff: {role: viewer, channels: [\"lab-[\"]}\n", field: `access.groups["staff"].channels`, says: "not a channel pattern"},
		{doc: goodSSO, env: env, field: "api.sso", says: "access.groups maps no group"},
		{doc: strings.Replace(goodSSO, "https://login.example.org", "http://login.example.org", 1) + groups, env: env,
			field: "api.sso.oidc.issuer", says: "is http: to another machine"},
		{doc: strings.Replace(goodSSO, `"${OIDC_SECRET}"`, "hunter2hunter2", 1) + groups, env: env,
			field: "api.sso.oidc.client_secret", says: "must be a reference to the environment variable"},
		{doc: goodSSO + groups, env: map[string]string{}, field: "api.sso.oidc.client_secret", says: "OIDC_SECRET is not set"},
		{doc: strings.Replace(goodSSO, "      client_id: mefor\n", "", 1) + groups, env: env, field: "api.sso.oidc.client_id", says: "is required"},
		{doc: strings.Replace(goodSSO, "/api/v1/sso/callback", "/callback", 1) + groups, env: env,
			field: "api.sso.oidc.redirect_url", says: "followed by /api/v1/sso/callback"},
		{doc: "api:\n  listen: 127.0.0.1:8080\n  sso: {}\n" + groups, field: "api.sso.oidc", says: "is required"},
	} {
		_, err := parse(t, accessBase+tt.doc, tt.env)
		if err == nil || !strings.Contains(err.Error(), ": "+tt.field+" ") || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s\n%v\nwant an error at %s saying %q", tt.doc, err, tt.field, tt.says)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("an error quotes the client secret: %v", err)
		}
	}
	// HTTP to a loopback issuer is allowed: the tests' provider.
	if _, err := parse(t, accessBase+strings.Replace(goodSSO, "https://login.example.org", "http://127.0.0.1:5556", 1)+groups, env); err != nil {
		t.Errorf("a loopback http issuer: %v", err)
	}
}
