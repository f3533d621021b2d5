package api_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkAuthentication is what authenticating costs an API request:
// GET /api/v1/me authenticated by an API token and by a session cookie,
// against an unauthenticated request answered by the same server over the
// same kept-alive HTTPS connection (a 404 of an unknown path, which reads
// nothing). Authentication's share is the difference; it prints
//
//	BENCH api-auth baseline_us=… token_us=… session_us=… token_added_us=… session_added_us=…
//
// Run it with `task bench-api`.
func BenchmarkAuthentication(b *testing.B) {
	ctx := context.Background()
	db := testcontainers.NewDB(b)
	store := identity.New(db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	if _, _, err := store.AddUser(ctx, identity.NewUser{Name: "vera", Role: identity.RoleViewer, Password: password}); err != nil {
		b.Fatal(err)
	}
	_, token, err := store.CreateToken(ctx, "vera", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	url, client := benchServer(b, db, store)

	login, err := http.NewRequest("POST", url+"/api/v1/login", strings.NewReader(`{"username":"vera","password":"`+password+`"}`))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := client.Do(login)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == api.SessionCookie {
			cookie = c
		}
	}
	if cookie == nil {
		b.Fatalf("login answered %d without a session cookie", resp.StatusCode)
	}

	get := func(path string, want int, set func(*http.Request)) func(b *testing.B) {
		return func(b *testing.B) {
			for range b.N {
				req, err := http.NewRequest("GET", url+path, nil)
				if err != nil {
					b.Fatal(err)
				}
				set(req)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					b.Fatalf("GET %s answered %d, want %d", path, resp.StatusCode, want)
				}
			}
		}
	}
	perOp := map[string]float64{}
	for _, c := range []struct {
		name, path string
		want       int
		set        func(*http.Request)
	}{
		{"baseline", "/api/v1/no-such-endpoint", http.StatusNotFound, func(*http.Request) {}},
		{"token", "/api/v1/me", http.StatusOK, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }},
		{"session", "/api/v1/me", http.StatusOK, func(r *http.Request) { r.AddCookie(cookie) }},
	} {
		res := testing.Benchmark(get(c.path, c.want, c.set))
		if res.N == 0 {
			b.Fatalf("%s: the benchmark did not run", c.name)
		}
		perOp[c.name] = float64(res.NsPerOp()) / 1000
		b.Logf("%s: %s", c.name, res)
	}
	fmt.Printf("BENCH api-auth baseline_us=%.0f token_us=%.0f session_us=%.0f token_added_us=%.0f session_added_us=%.0f\n",
		perOp["baseline"], perOp["token"], perOp["session"], perOp["token"]-perOp["baseline"], perOp["session"]-perOp["baseline"])
}

// benchServer serves the API over HTTPS on loopback for a benchmark, with
// the reads of package ops on db, and returns its URL and a client that
// trusts it.
func benchServer(b *testing.B, db *testcontainers.DB, store *identity.Store) (string, *http.Client) {
	b.Helper()
	ca := certtest.NewCA(b, "mefor bench CA")
	cert, key := ca.Issue(b, "localhost", certtest.Options{}).WriteFiles(b, b.TempDir(), "api")
	srv, err := api.New(api.Config{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key, Reads: ops.APIReads{Pool: db.Pool}},
		store, fixtures.Logger(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	return "https://" + ln.Addr().String(), &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
}
