package config

import (
	"net/url"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/egress"
)

// SSOCallbackPath is where the identity provider sends the browser back:
// api.sso.oidc.redirect_url must end in it.
const SSOCallbackPath = "/api/v1/sso/callback"

// SSO is the api.sso section: logging in through the organization's
// directory instead of a mefor password (docs/access.md).
type SSO struct {
	// OIDC is the OpenID Connect provider.
	OIDC OIDC
}

// OIDC is an OpenID Connect provider mefor is a client of, with the
// authorization code flow and PKCE.
type OIDC struct {
	// Issuer is the provider's issuer URL, whose
	// /.well-known/openid-configuration mefor reads. HTTPS, or HTTP on a
	// loopback address.
	Issuer string
	// ClientID and ClientSecret are mefor's registration at the provider.
	// The secret is given as ${NAME} and read from that variable.
	ClientID     string
	ClientSecret string
	// ClientSecretVar names the variable the secret was read from.
	ClientSecretVar string
	// RedirectURL is the callback as registered at the provider: this
	// API's address followed by /api/v1/sso/callback.
	RedirectURL string
	// GroupsClaim is the ID token claim listing the person's groups.
	// Defaults to groups.
	GroupsClaim string
	// Scopes are requested besides openid. Defaults to profile and email.
	Scopes []string
	// RequireAMR, when set, lets a person whose role requires MFA in only
	// when the ID token's amr claim holds one of these values (e.g. mfa,
	// otp). Defaults to none: MFA is the provider's policy.
	RequireAMR []string
}

const secretExample = `e.g. client_secret: "${MEFOR_OIDC_CLIENT_SECRET}"`

func (l *loader) decodeSSO(n *yaml.Node, p path) *SSO {
	m := l.mapping(n, p, "oidc")
	on, ok := m["oidc"]
	op := p.key("oidc")
	if !ok {
		if !l.failed(p) {
			l.errorf(op, "is required: the OpenID Connect provider, e.g. oidc: {issuer: https://login.example.org/realms/hospital, client_id: mefor, "+
				"client_secret: \"${MEFOR_OIDC_CLIENT_SECRET}\", redirect_url: https://mefor.example.org:8443/api/v1/sso/callback}")
		}
		return nil
	}
	s := &SSO{OIDC: OIDC{GroupsClaim: "groups", Scopes: []string{"profile", "email"}}}
	o := &s.OIDC
	om := l.mapping(on, op, "issuer", "client_id", "client_secret", "redirect_url", "groups_claim", "scopes", "require_amr")
	decodeScalar(l, om, op, "issuer", &o.Issuer, asString)
	decodeScalar(l, om, op, "client_id", &o.ClientID, asString)
	decodeScalar(l, om, op, "redirect_url", &o.RedirectURL, asString)
	decodeScalar(l, om, op, "groups_claim", &o.GroupsClaim, asString)
	l.strings(om, op, "scopes", &o.Scopes)
	l.strings(om, op, "require_amr", &o.RequireAMR)
	if sn, ok := om["client_secret"]; ok {
		sp := op.key("client_secret")
		// Like encryption.keys: the secret is never written in the file,
		// which is copied, diffed and hashed. No error quotes the value.
		if ref := varRef.FindStringSubmatch(sn.Value); sn.Kind != yaml.ScalarNode || ref == nil {
			l.errorAt(sn, sp, "must be a reference to the environment variable holding the secret and nothing else, %s; "+
				"a secret is never written in the file", secretExample)
			l.bad[sp] = true
		} else if v, _ := l.getenv(ref[1]); v == "" {
			l.errorAt(sn, sp, "uses ${%s}, but %s is not set in the environment (or is empty); set it to the client secret the provider gave mefor",
				ref[1], ref[1])
			l.bad[sp] = true
		} else {
			o.ClientSecret, o.ClientSecretVar = v, ref[1]
		}
	}
	return s
}

// checkSSO checks api.sso.oidc: every field given, HTTPS URLs (HTTP only
// to a loopback address, as in tests), and a redirect to this API's
// callback.
func (l *loader) checkSSO(c *Config) {
	if c.API == nil || c.API.SSO == nil {
		return
	}
	o := c.API.SSO.OIDC
	p := path{section: "api"}.key("sso").key("oidc")
	required := map[string]string{
		"issuer":        "the provider's issuer URL, e.g. issuer: https://login.microsoftonline.com/TENANT-ID/v2.0",
		"client_id":     "mefor's client (application) id at the provider",
		"client_secret": "the client secret, " + secretExample,
		"redirect_url":  "this API's callback as registered at the provider, e.g. redirect_url: https://mefor.example.org:8443" + SSOCallbackPath,
	}
	given := map[string]string{"issuer": o.Issuer, "client_id": o.ClientID, "client_secret": o.ClientSecret, "redirect_url": o.RedirectURL}
	for _, k := range []string{"issuer", "client_id", "client_secret", "redirect_url"} {
		if given[k] == "" && !l.failed(p.key(k)) {
			l.errorf(p.key(k), "is required: %s", required[k])
		}
	}
	if o.Issuer != "" && !l.failed(p.key("issuer")) {
		if why := webURL(o.Issuer); why != "" {
			l.errorf(p.key("issuer"), "%s; the issuer is the URL the provider's ID tokens name in iss, whose /.well-known/openid-configuration mefor reads", why)
		}
	}
	if o.RedirectURL != "" && !l.failed(p.key("redirect_url")) {
		if why := webURL(o.RedirectURL); why != "" {
			l.errorf(p.key("redirect_url"), "%s", why)
		} else if u, _ := url.Parse(o.RedirectURL); u.Path != SSOCallbackPath || u.RawQuery != "" {
			l.errorf(p.key("redirect_url"), "must be this API's address followed by %s (e.g. https://%s%s), the path mefor takes the provider's answer on",
				SSOCallbackPath, u.Host, SSOCallbackPath)
		}
	}
	if gp := p.key("groups_claim"); !l.failed(gp) && strings.TrimSpace(o.GroupsClaim) == "" {
		l.errorf(gp, "is empty: the ID token claim that lists the person's groups (e.g. groups_claim: groups, the default)")
	}
}

// webURL explains why raw is not an https URL (or an http one to a
// loopback address), or is "".
func webURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "":
		return "is not a URL (e.g. https://login.example.org/realms/hospital)"
	case u.User != nil:
		return "carries a user name or password, which would show wherever the URL does"
	case u.Fragment != "":
		return "has a #fragment, which a provider's URL never has"
	case u.Scheme == "https":
		return ""
	case u.Scheme == "http" && egress.IsLoopback(u.Hostname()):
		return ""
	case u.Scheme == "http":
		return "is http: to another machine, where anyone on the path could read or change the sign-in; use https:// (http is allowed only to a loopback address, for tests)"
	}
	return "must be an https:// URL"
}

// ssoOutbound is the connection to the identity provider (discovery, keys,
// code exchange), checked against egress.allow like every other.
func (l *loader) ssoOutbound(c *Config) []Outbound {
	if c.API == nil || c.API.SSO == nil {
		return nil
	}
	ip := path{section: "api"}.key("sso").key("oidc").key("issuer")
	u, host, port, ok := urlTarget(c.API.SSO.OIDC.Issuer)
	if !ok || l.failed(ip) || webURL(c.API.SSO.OIDC.Issuer) != "" {
		return nil
	}
	return []Outbound{{Target: "sso:oidc", Host: host, Port: port, Protocol: u.Scheme, p: ip}}
}
