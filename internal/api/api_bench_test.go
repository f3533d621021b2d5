package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/apiserver"
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
	srv := apiserver.Start(b, testcontainers.NewDB(b))
	token := srv.Token(b, "vera", identity.RoleViewer)
	url, client := srv.URL, srv.Client

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

	// Each request kind in turn, after a warm-up, timed over rounds
	// requests; rounds is large enough to average out the scheduler.
	const rounds = 2000
	get := func(path string, want int, set func(*http.Request)) time.Duration {
		b.Helper()
		var took time.Duration
		for i := range rounds + 200 {
			req, err := http.NewRequest("GET", url+path, nil)
			if err != nil {
				b.Fatal(err)
			}
			set(req)
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if i >= 200 {
				took += time.Since(t0)
			}
			if resp.StatusCode != want {
				b.Fatalf("GET %s answered %d, want %d", path, resp.StatusCode, want)
			}
		}
		return took / rounds
	}
	perOp := map[string]float64{}
	for range b.N {
		for _, c := range []struct {
			name, path string
			want       int
			set        func(*http.Request)
		}{
			{"baseline", "/api/v1/no-such-endpoint", http.StatusNotFound, func(*http.Request) {}},
			{"token", "/api/v1/me", http.StatusOK, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }},
			{"session", "/api/v1/me", http.StatusOK, func(r *http.Request) { r.AddCookie(cookie) }},
		} {
			perOp[c.name] = float64(get(c.path, c.want, c.set).Nanoseconds()) / 1000
		}
	}
	fmt.Printf("BENCH api-auth baseline_us=%.0f token_us=%.0f session_us=%.0f token_added_us=%.0f session_added_us=%.0f\n",
		perOp["baseline"], perOp["token"], perOp["session"], perOp["token"]-perOp["baseline"], perOp["session"]-perOp["baseline"])
}
