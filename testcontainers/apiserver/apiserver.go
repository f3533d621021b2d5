// Package apiserver serves mefor's HTTPS API over a test database, for
// benchmarks and tests outside package api that time or drive it through a
// real client: reads of package ops, an identity store with cheap password
// hashes, a certificate of a CA of its own.
package apiserver

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Server is an API server on loopback and a client that trusts it.
type Server struct {
	URL    string
	Client *http.Client
	Store  *identity.Store
}

// Start serves the API over db until the test ends.
func Start(t testing.TB, db *testcontainers.DB) *Server {
	t.Helper()
	store := identity.New(db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	ca := certtest.NewCA(t, "mefor test API CA")
	cert, key := ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, t.TempDir(), "api")
	srv, err := api.New(api.Config{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key, Reads: ops.APIReads{Pool: db.Pool}},
		store, fixtures.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &Server{URL: "https://" + ln.Addr().String(), Store: store,
		Client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}}
}

// Token adds a user of role (with channel patterns; none: every channel)
// whose role needs no second factor, and returns an API token of theirs.
func (s *Server) Token(t testing.TB, name, role string, channels ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, _, err := s.Store.AddUser(ctx, identity.NewUser{Name: name, Role: role, Channels: channels, Password: "correct horse battery"}); err != nil {
		t.Fatal(err)
	}
	_, token, err := s.Store.CreateToken(ctx, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return token
}
