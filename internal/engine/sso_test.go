package engine_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A node whose config has api.sso and access: logs a person in through
// the provider with the custom role their directory group maps to,
// reaching the provider through its egress policy; a reload that changes
// access: is refused (roles and mappings are read at start).
func TestNodeLogsInThroughSSOWithTheConfigsRoles(t *testing.T) {
	// Not parallel: the client secret comes from the environment.
	idp, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := idp.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idp.Shutdown() })
	t.Setenv("TEST_OIDC_SECRET", idp.ClientSecret)

	db := testcontainers.NewDB(t)
	ca := certtest.NewCA(t, "api CA")
	certFile, keyFile := ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, t.TempDir(), "api")
	apiAddr := fixtures.FreeAddr(t)
	doc := func(group string) string {
		return fmt.Sprintf(`cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [down]}]
destinations:
  down: {type: mllp, mllp: {address: 127.0.0.1:9}}
egress:
  allow: [127.0.0.1]
api:
  listen: %q
  tls: {cert_file: %q, key_file: %q}
  sso:
    oidc:
      issuer: %s
      client_id: %s
      client_secret: "${TEST_OIDC_SECRET}"
      redirect_url: https://%s/api/v1/sso/callback
      scopes: [profile, email, groups]
access:
  roles:
    lab-lead: {permissions: [status, messages.read, replay]}
  groups:
    %s: {role: lab-lead, channels: ["lab-*"]}
`, fixtures.FreeAddr(t), apiAddr, certFile, keyFile, idp.Issuer(), idp.ClientID, apiAddr, group)
	}
	path, cfg := configFile(t, "sso.yaml", doc("leads"))
	node, _ := watchedNode(t, db, cfg, "sso")

	idp.QueueUser(&mockoidc.MockUser{Subject: "sub-lea", PreferredUsername: "lea", Groups: []string{"leads"}})
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	resp, err := browser.Get("https://" + apiAddr + "/api/v1/sso/login")
	if err != nil {
		t.Fatal(err)
	}
	var login map[string]any
	err = json.NewDecoder(resp.Body).Decode(&login)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || login["user"] != "lea" || login["role"] != "lab-lead" {
		t.Fatalf("SSO login through the node: %d %v %v", resp.StatusCode, login, err)
	}
	resp, err = browser.Get("https://" + apiAddr + "/api/v1/me")
	if err != nil {
		t.Fatal(err)
	}
	var me map[string]any
	err = json.NewDecoder(resp.Body).Decode(&me)
	resp.Body.Close()
	if err != nil || fmt.Sprint(me["permissions"]) != "[status messages.read replay]" || fmt.Sprint(me["channels"]) != "[lab-*]" {
		t.Fatalf("me: %v %v", me, err)
	}

	if err := os.WriteFile(path, []byte(strings.Replace(doc("leads"), "role: lab-lead", "role: viewer", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = node.Reload(context.Background())
	var re *engine.RestartError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "access:") {
		t.Fatalf("a reload changing access.groups: %v, want a RestartError naming access:", err)
	}
}
