package engine_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A node with an api: section serves the API over HTTPS on a listener
// gated like an MLLP one: a user logs in and is known; a source outside
// api.allow is closed before the handshake and counted; a reload that
// changes the section is refused (the listener is fixed at start).
func TestNodeServesTheAPI(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ca := certtest.NewCA(t, "api CA")
	certFile, keyFile := ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, t.TempDir(), "api")
	apiAddr := fixtures.FreeAddr(t)
	doc := func(apiListen string) string {
		return adtToDown(fixtures.FreeAddr(t), "", "127.0.0.1:9", fmt.Sprintf(`api:
  listen: %q
  tls: {cert_file: %q, key_file: %q}
  allow: [127.0.0.1]
`, apiListen, certFile, keyFile))
	}
	path, cfg := configFile(t, "api.yaml", doc(apiAddr))
	n, _ := watchedNode(t, db, cfg, "api")
	if n.APIAddr() != apiAddr {
		t.Fatalf("the API listens on %q, want %q", n.APIAddr(), apiAddr)
	}

	store := identity.New(db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	if _, _, err := store.AddUser(context.Background(), identity.NewUser{Name: "vic", Role: identity.RoleViewer, Password: "correct horse battery"}); err != nil {
		t.Fatal(err)
	}
	client := func(from string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
			TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	}
	body, _ := json.Marshal(map[string]string{"username": "vic", "password": "correct horse battery"})
	resp, err := client("127.0.0.1").Post("https://"+apiAddr+"/api/v1/login", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure {
		t.Fatalf("login through the node: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	// The node serves the reads from its own pool: the node list names it.
	req, _ := http.NewRequest("GET", "https://"+apiAddr+"/api/v1/nodes", nil)
	req.AddCookie(resp.Cookies()[0])
	nresp, err := client("127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var nodes struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
	}
	err = json.NewDecoder(nresp.Body).Decode(&nodes)
	nresp.Body.Close()
	if err != nil || nresp.StatusCode != http.StatusOK || len(nodes.Nodes) != 1 || nodes.Nodes[0].ID != "api" {
		t.Fatalf("the node list through the node: %d %+v %v", nresp.StatusCode, nodes, err)
	}

	if _, err := client("127.0.0.2").Post("https://"+apiAddr+"/api/v1/login", "application/json", bytes.NewReader(body)); err == nil {
		t.Fatal("a source outside api.allow logged in")
	}
	if got := nodeMetric(t, n, "mefor_connections_refused_total", "channel", "(api)", "reason", "not_allowed"); got != 1 {
		t.Errorf("refused API connections counted %v, want 1", got)
	}

	if err := os.WriteFile(path, []byte(doc(fixtures.FreeAddr(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = n.Reload(context.Background())
	var re *engine.RestartError
	if !errors.As(err, &re) {
		t.Fatalf("a reload moving the API: %v, want a RestartError", err)
	}
}
