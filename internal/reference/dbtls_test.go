package reference_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/testcontainers"
)

// A SQL source on another host reached without TLS is refused before any
// connection is made; allow_insecure_database lets it through. The source
// database is real: the harness's, reached through a forwarder on this
// machine's network address so that the URL names a remote host.
func TestSyncSQLDatabaseTLSRule(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	lims := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := lims.Pool.Exec(ctx, `
		CREATE TABLE lab_map (code text, loinc text);
		INSERT INTO lab_map VALUES ('GLU', '2345-7')`); err != nil {
		t.Fatal(err)
	}
	remote, conns := lims.RemoteURL(t) // sslmode=disable, from the harness
	src := &config.SQLSource{DatabaseURL: remote, Query: "select code, loinc from lab_map", Timeout: 10 * time.Second}
	set := &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{SQL: src}}
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}

	_, err := syncer.Sync(ctx, set)
	if err == nil {
		t.Fatal("synced from a remote database over plaintext")
	}
	for _, want := range []string{"refused", "sslmode=disable", "sslmode=verify-full&sslrootcert=", "allow_insecure_database: true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal does not say %q: %v", want, err)
		}
	}
	if u, _ := url.Parse(remote); strings.Contains(err.Error(), func() string { p, _ := u.User.Password(); return p }()) {
		t.Errorf("refusal shows the password: %v", err)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections reached the source before the refusal", n)
	}

	src.AllowInsecureDatabase = true
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatalf("with allow_insecure_database: %v", err)
	}
	if conns.Load() == 0 {
		t.Fatal("the sync did not go through the forwarder")
	}
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Errorf("GLU -> %q after the allowed sync", got)
	}
}
