package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/testcontainers"
)

func TestDatabaseTLSRule(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tt := range []struct {
		url     string
		refused bool
		says    string
	}{
		{url: "postgres://mefor:s3cret@db.example.org/mefor", refused: true, says: "no sslmode (pgx then uses prefer"},
		{url: "postgres://mefor:s3cret@db.example.org/mefor?sslmode=prefer", refused: true, says: "sslmode=prefer"},
		{url: "postgres://mefor:s3cret@db.example.org/mefor?sslmode=allow", refused: true, says: "sslmode=allow"},
		{url: "postgres://mefor:s3cret@10.0.0.5:5432/mefor?sslmode=disable", refused: true, says: "sslmode=disable"},
		{url: "host=db.example.org user=mefor password=s3cret sslmode=disable", refused: true, says: "sslmode=disable"},
		{url: "postgres://mefor:s3cret@127.0.0.1,db.example.org/mefor?sslmode=disable", refused: true},
		{url: "postgres://mefor:s3cret@db.example.org/mefor?sslmode=require"},
		{url: "postgres://mefor:s3cret@db.example.org/mefor?sslmode=verify-full"},
		{url: "postgres://mefor:s3cret@127.0.0.1:5432/mefor?sslmode=disable"},
		{url: "postgres://mefor:s3cret@localhost/mefor"},
		{url: "postgres://mefor:s3cret@[::1]:5432/mefor?sslmode=disable"},
		{url: "postgres:///mefor?host=/var/run/postgresql"},
	} {
		cfg, err := pgconn.ParseConfig(tt.url)
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		err = checkDatabaseTLS(cfg, tt.url)
		if !tt.refused {
			if err != nil {
				t.Errorf("%s refused: %v", tt.url, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s allowed, want it refused", tt.url)
			continue
		}
		msg := err.Error()
		for _, want := range []string{"sslmode=verify-full", "sslrootcert=", "--allow-insecure-database", tt.says} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error does not say %q:\n%s", tt.url, want, msg)
			}
		}
		if strings.Contains(msg, "s3cret") {
			t.Errorf("%s: error shows the password: %s", tt.url, msg)
		}
	}
}

// A command pointed at a database on another host without TLS refuses
// before connecting; --allow-insecure-database lets it through.
func TestInsecureDatabaseRefusedAndOverridden(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	remote, conns := db.RemoteURL(t) // sslmode=disable, from the harness

	var stdout, stderr bytes.Buffer
	if code := run([]string{"--database-url", remote, "migrate", "--status"}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1 (refused)\n%s%s", code, stdout.String(), stderr.String())
	}
	if msg := stderr.String(); !strings.Contains(msg, "sslmode=verify-full") || !strings.Contains(msg, "--allow-insecure-database") {
		t.Errorf("refusal does not say what to set:\n%s", msg)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections reached the database before the refusal", n)
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"--database-url", remote, "--allow-insecure-database", "migrate", "--status"}, &stdout, &stderr); code != 0 {
		t.Fatalf("with --allow-insecure-database: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if conns.Load() == 0 || !strings.Contains(stdout.String(), "river") {
		t.Fatalf("with --allow-insecure-database the command did not reach the database:\n%s", stdout.String())
	}
}

// `mefor config check` reports a SQL reference-set source that would reach
// another host without TLS as it reports every config problem: the file,
// the line, the field and the fix, without the URL's password.
func TestConfigCheckInsecureSQLSource(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	dir := t.TempDir()
	write := func(extra string) string {
		p := filepath.Join(dir, "mefor.yaml")
		if err := os.WriteFile(p, []byte(`channels:
  lab:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{handler: loinc, destinations: [archive]}]
handlers:
  loinc:
    type: map
    map: [{lookup: {from: OBX-3.1, set: lab-codes, on_miss: keep}}]
destinations:
  archive: {type: file, file: {directory: ./out}}
reference_sets:
  lab-codes:
    source:
      sql:
        database_url: "postgres://lims:s3cret@lims.example.org:5432/lims?sslmode=disable"
        query: select code, loinc from lab_map`+extra+`
`), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := write("")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"config", "check", cfg}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		cfg + `:15: reference_set "lab-codes": source.sql.database_url connects to lims.example.org with sslmode=disable`,
		"sslmode=verify-full&sslrootcert=", "allow_insecure_database: true",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+stderr.String(), "s3cret") {
		t.Errorf("config check shows the password:\n%s%s", out, stderr.String())
	}

	write("\n        allow_insecure_database: true")
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"config", "check", cfg}, &stdout, &stderr); code != 0 {
		t.Fatalf("with allow_insecure_database: true: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// Every command's sessions commit durably on a server whose default is not
// (the suite's), unless the URL names a level itself: a command that stores
// or changes messages must not be answered before its commit is on disk.
func TestCommandSessionsCommitDurably(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	setting := func(url string) string {
		t.Helper()
		g := &Globals{DatabaseURL: url}
		pool, err := g.pool(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var v string
		if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	var server string
	if err := db.Pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&server); err != nil || server != "off" {
		t.Fatalf("the suite's server default is %q (%v); this test needs it off", server, err)
	}
	if got := setting(db.URL); got != "on" {
		t.Fatalf("a command's session on a server defaulting to off: synchronous_commit %q, want on", got)
	}
	if got := setting(db.URL + "&synchronous_commit=remote_apply"); got != "remote_apply" {
		t.Fatalf("a URL naming remote_apply: synchronous_commit %q, want remote_apply", got)
	}
}
