package reference_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// An HTTPS source with a tls: block and headers: the GET is verified
// against the block's CA and carries the headers, whose values appear in
// no error; a redirect to http:// on another port is refused, the server
// redirected to sees nothing, and the last snapshot stays live.
func TestHTTPSourceWithTLSAndHeaders(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	var plainHits atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		io.WriteString(w, "code,loinc\nGLU,0000-0\n")
	}))
	defer plain.Close()
	var mu sync.Mutex
	var auth []string
	ca := certtest.NewCA(t, "Terminology CA")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.URL.Query().Get("moved") != "" {
			http.Redirect(w, r, plain.URL+"/codes.csv", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/csv")
		io.WriteString(w, "code,loinc\nGLU,2345-7\n")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", certtest.Options{}).TLS}}
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	doc := func(query string) *config.Config {
		cfg, err := config.Parse("mefor.yaml", []byte(fmt.Sprintf(fixtures.ADTToFile+`reference_sets:
  lab-codes:
    source:
      http:
        url: "https://localhost:%s/codes.csv%s"
        headers: {Authorization: "Bearer ${TERM_TOKEN}"}
        tls: {ca_file: %q}
`, port, query, ca.WriteFile(t, t.TempDir(), "ca.crt"))), func(k string) (string, bool) { return "s3cret", k == "TERM_TOKEN" })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	sync := func(cfg *config.Config) error {
		set, err := tlsconf.New(cfg, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1", Egress: func(rs *config.ReferenceSet) reference.Egress {
			return reference.EgressOf(nil, set.ReferenceClient(rs.Name).Config(), rs)
		}}
		_, err = syncer.Sync(ctx, cfg.ReferenceSet("lab-codes"))
		return err
	}

	if err := sync(doc("")); err != nil {
		t.Fatal(err)
	}
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Fatalf("GLU -> %q", got)
	}
	mu.Lock()
	if len(auth) != 1 || auth[0] != "Bearer s3cret" {
		t.Errorf("the source got Authorization %q, want the configured header", auth)
	}
	mu.Unlock()

	err := sync(doc("?moved=1"))
	if err == nil || !strings.Contains(err.Error(), "refused a redirect") || !strings.Contains(err.Error(), plain.URL+"/codes.csv") {
		t.Fatalf("redirect to http: %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows a header value: %v", err)
	}
	if n := plainHits.Load(); n != 0 {
		t.Fatalf("the plaintext server got %d requests", n)
	}
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Fatalf("after the refused redirect GLU -> %q, want the last snapshot's", got)
	}
}

type pinAnswer netip.Addr

func (a pinAnswer) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.Addr(a)}, nil
}

// A SQL source whose host resolves to another address than it had when
// the policy was built connects nowhere: the sync fails saying egress, and
// the forwarder in front of the database accepted no connection. Pinned to
// its real address, the same source syncs.
func TestSQLSourceDialsThroughTheEgressPolicy(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	lims := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := lims.Pool.Exec(ctx, `CREATE TABLE lab_map (code text, loinc text); INSERT INTO lab_map VALUES ('GLU', '2345-7')`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(lims.URL)
	if err != nil {
		t.Fatal(err)
	}
	fwd, conns := forward(t, u.Host)
	_, port, _ := net.SplitHostPort(fwd)
	u.Host = "localhost:" + port
	set := &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{SQL: &config.SQLSource{
		DatabaseURL: u.String(), Query: "select code, loinc from lab_map", Timeout: 10 * time.Second}}}
	list := egress.List{}
	e, _ := egress.ParseEntry("localhost")
	list = append(list, e)
	var refusals atomic.Int32
	syncWith := func(pinned string) error {
		p, _ := egress.NewPolicy(ctx, list, config.SQLHosts(set.Source.SQL.DatabaseURL), egress.Options{
			Resolver: pinAnswer(netip.MustParseAddr(pinned)),
			OnRefuse: func(*egress.RefusedError) { refusals.Add(1) },
		})
		syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1", Egress: func(rs *config.ReferenceSet) reference.Egress {
			return reference.EgressOf(p, nil, rs)
		}}
		_, err := syncer.Sync(ctx, set)
		return err
	}
	err = syncWith("127.0.0.2")
	if err == nil || !strings.Contains(err.Error(), "egress: reference_set:lab-codes may not connect to 127.0.0.1:"+port) {
		t.Fatalf("sync with a moved host: %v", err)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections reached the database", n)
	}
	if refusals.Load() == 0 {
		t.Error("the refusal was not reported")
	}
	if err := syncWith("127.0.0.1"); err != nil {
		t.Fatalf("sync with the host pinned to its address: %v", err)
	}
	if conns.Load() == 0 {
		t.Fatal("the sync did not go through the forwarder")
	}
}

// forward accepts connections on a loopback port and copies them to
// target, counting them.
func forward(t *testing.T, target string) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), testcontainers.Forward(t, ln, target)
}
