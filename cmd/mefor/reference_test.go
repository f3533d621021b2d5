package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// TestReferenceCLI drives `mefor reference list|show|sync` against a node
// running in this process.
func TestReferenceCLI(t *testing.T) {
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "lab.csv")
	if err := os.WriteFile(csvPath, []byte("code,loinc,display\nGLU,2345-7,Glucose\nNA,2951-2,Sodium\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listen := fixtures.FreeAddr(t)
	cfgPath := filepath.Join(dir, "mefor.yaml")
	y := fmt.Sprintf(`
channels:
  lab:
    inbound:
      mllp: {listen: "%s"}
    routes:
      - handler: loinc
        destinations: [archive]
handlers:
  loinc:
    type: map
    map:
      - lookup: {from: OBX-3.1, set: lab-codes, on_miss: keep}
destinations:
  archive:
    type: file
    file: {directory: "%s"}
reference_sets:
  lab-codes:
    refresh: "0 3 * * *"
    source:
      csv: {path: "%s"}
`, listen, filepath.Join(dir, "out"), csvPath)
	if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &opsFixture{db: db}

	// Before any node ran, the set has no snapshot.
	sets := decode[[]ops.ReferenceSetView](t, f.ok(t, "reference", "list", "--config", cfgPath, "--json"))
	if len(sets) != 1 || sets[0].Name != "lab-codes" || sets[0].Version != 0 || sets[0].Refresh != "0 3 * * *" {
		t.Fatalf("list before any sync: %+v", sets)
	}

	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cluster.Start(t, engine.Options{Config: cfg, Pool: db.Pool, NodeID: "cli-node"})

	out := f.ok(t, "reference", "sync", "lab-codes", "--config", cfgPath, "--wait", "30s")
	if !strings.Contains(out, "lab-codes: synced on cli-node") || !strings.Contains(out, "2 rows") {
		t.Fatalf("sync output:\n%s", out)
	}
	out = f.ok(t, "reference", "show", "lab-codes", "--config", cfgPath, "--key", "GLU")
	for _, want := range []string{"source:   csv " + csvPath, "2 rows", "KEY", "LOINC", "DISPLAY", "GLU", "2345-7", "Glucose"} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "2951-2") {
		t.Errorf("show --key GLU shows other rows:\n%s", out)
	}
	// Showing values is audited, naming the set, never the key asked for.
	if recs := f.auditRows(t, "--action", "view-reference"); len(recs) != 1 ||
		targetOf(t, recs[0])["set"] != "lab-codes" || targetOf(t, recs[0])["by_key"] != true ||
		strings.Contains(string(recs[0].Target), "GLU") {
		t.Errorf("view-reference rows = %+v", recs)
	}

	// An operator reads the values only through mefor: `reference show`
	// works and is recorded under its name, its own SELECT is refused.
	f.ok(t, "migrate")
	opName, operator := newLogin(t, db, migrations.RoleOperator)
	if code, out, errs := as(t, operator, "reference", "show", "lab-codes", "--config", cfgPath, "--key", "GLU"); code != 0 ||
		!strings.Contains(out, "2345-7") || strings.Contains(out, "2951-2") {
		t.Errorf("operator: reference show --key GLU: exit %d\n%s%s", code, out, errs)
	}
	seen := false
	for _, r := range f.auditRows(t, "--action", "view-reference") {
		seen = seen || (r.DBRole == opName && targetOf(t, r)["rows"] == float64(1))
	}
	if !seen {
		t.Errorf("no view-reference row of the operator showing one row")
	}
	opConn, err := pgx.Connect(context.Background(), operator)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = opConn.Close(context.Background()) }()
	var v []byte
	if err := opConn.QueryRow(context.Background(), `SELECT value FROM mefor_reference_row LIMIT 1`).Scan(&v); !migrations.IsPermissionDenied(err) {
		t.Errorf("operator's SELECT of reference values: %v; want permission denied", err)
	}

	// A failing source: the command says so and exits 1; the snapshot stays.
	if err := os.Remove(csvPath); err != nil {
		t.Fatal(err)
	}
	code, out, _ := f.mefor(t, "reference", "sync", "lab-codes", "--config", cfgPath, "--wait", "30s")
	if code != 1 || !strings.Contains(out, "sync failed on cli-node, the last snapshot stays live") || !strings.Contains(out, "no such file") {
		t.Fatalf("failed sync: exit %d\n%s", code, out)
	}
	out = f.ok(t, "reference", "list", "--config", cfgPath)
	if !strings.Contains(out, "loinc,display") || !strings.Contains(out, "no such file") {
		t.Errorf("list after failed sync:\n%s", out)
	}
	sets = decode[[]ops.ReferenceSetView](t, f.ok(t, "reference", "list", "--config", cfgPath, "--json"))
	if sets[0].Version == 0 || sets[0].Rows != 2 || sets[0].LastError == "" {
		t.Errorf("list after failed sync: %+v, want the snapshot kept and the error shown", sets[0])
	}

	code, _, errs := f.mefor(t, "reference", "show", "lab-kodes", "--config", cfgPath)
	if code == 0 || !strings.Contains(errs, `unknown reference set "lab-kodes" (sets of this config: lab-codes)`) {
		t.Errorf("unknown set: exit %d, stderr %s", code, errs)
	}
}
