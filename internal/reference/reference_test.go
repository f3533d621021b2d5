package reference_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/maintenance"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// csvSet is the set lab-codes read from dir/lab.csv, which holds content.
func csvSet(t *testing.T, dir, content string) *config.ReferenceSet {
	path := writeFile(t, dir, "lab.csv", content)
	return &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{CSV: &config.CSVSource{Path: path}}}
}

func lookup(t *testing.T, c *reference.Cache, set, key, column string) string {
	t.Helper()
	v, found, err := c.Lookup(set, key, column)
	if err != nil {
		t.Fatalf("Lookup(%s, %s, %s): %v", set, key, column, err)
	}
	if !found {
		return "<miss>"
	}
	return v
}

// newSyncer is a test's own database and the syncer of node n1 on it.
func newSyncer(t *testing.T) (*testcontainers.DB, *reference.Syncer) {
	db := testcontainers.NewDB(t)
	return db, &reference.Syncer{Pool: db.Pool, NodeID: "n1"}
}

// newCache is a node's cache of the reference sets in db, loaded once.
func newCache(t *testing.T, db *testcontainers.DB) *reference.Cache {
	t.Helper()
	c := reference.NewCache(db.Pool, nil, nil)
	refresh(t, c)
	return c
}

func refresh(t *testing.T, c *reference.Cache) {
	t.Helper()
	if _, err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// expect refreshes c, then fails the test unless key looks up in lab-codes'
// column as want ("<miss>" for a key the set lacks).
func expect(t *testing.T, c *reference.Cache, key, column, want string) {
	t.Helper()
	refresh(t, c)
	if got := lookup(t, c, "lab-codes", key, column); got != want {
		t.Errorf("%s/%s -> %q, want %q", key, column, got, want)
	}
}

// syncOK syncs set through s and fails the test if that fails.
func syncOK(t *testing.T, s *reference.Syncer, set *config.ReferenceSet) reference.SyncResult {
	t.Helper()
	res, err := s.Sync(context.Background(), set)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// syncFails syncs set through s and fails the test unless that fails with
// an error containing want, which it returns.
func syncFails(t *testing.T, s *reference.Syncer, set *config.ReferenceSet, want string) error {
	t.Helper()
	_, err := s.Sync(context.Background(), set)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("sync error %v, want one containing %q", err, want)
	}
	return err
}

func lastRun(t *testing.T, db *testcontainers.DB, set string) maintenance.MaintenanceRun {
	t.Helper()
	runs, err := maintenance.LastRuns(context.Background(), db.Pool, []string{reference.JobName(set)})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := runs[reference.JobName(set)]
	if !ok {
		t.Fatalf("no audited run of %s", reference.JobName(set))
	}
	return r
}

func TestSyncCSVAndLookup(t *testing.T) {
	db, syncer := newSyncer(t)
	dir := t.TempDir()
	set := csvSet(t, dir, "\ufefflocal_code,loinc,display\nGLU,2345-7,Glucose\nNA,2951-2,\"Sodium, serum\"\n")

	if res := syncOK(t, syncer, set); res.Rows != 2 || res.Version == 0 {
		t.Fatalf("sync result %+v, want 2 rows and a version", res)
	}
	c := newCache(t, db)
	expect(t, c, "GLU", "", "2345-7")              // the first value column
	expect(t, c, "NA", "display", "Sodium, serum") // the quoted CSV value
	expect(t, c, "K", "", "<miss>")
	if _, _, err := c.Lookup("lab-codes", "GLU", "units"); err == nil || !strings.Contains(err.Error(), `no column "units"`) {
		t.Errorf("unknown column: %v", err)
	}
	if r := lastRun(t, db, "lab-codes"); r.Outcome != maintenance.RunOK || r.NodeID != "n1" {
		t.Errorf("audited run %+v, want ok by n1", r)
	}

	// Named key and value columns pick and order the columns.
	set.Key, set.Values = "loinc", []string{"display"}
	syncOK(t, syncer, set)
	expect(t, c, "2951-2", "", "Sodium, serum")
}

func TestFailedSyncKeepsLastSnapshot(t *testing.T) {
	ctx := context.Background()
	db, syncer := newSyncer(t)
	dir := t.TempDir()
	set := csvSet(t, dir, "code,loinc\nGLU,2345-7\n")
	good := syncOK(t, syncer, set)
	c := newCache(t, db)

	broken := []struct {
		name, content string
		set           func(*config.ReferenceSet)
		want          string
	}{
		{"missing file", "", nil, "no such file"},
		{"ragged row", "code,loinc\nGLU,1,2\n", nil, "line 2"},
		{"duplicate key", "code,loinc\nGLU,1\nGLU,2\n", nil, "line 3 repeats the key of line 2"},
		{"empty", "code,loinc\n", nil, "has no rows"},
		{"missing column", "code,loinc\nGLU,1\n", func(s *config.ReferenceSet) { s.Values = []string{"snomed"} }, `no value column "snomed"`},
	}
	for _, b := range broken {
		s := *set
		if b.content == "" && b.name == "missing file" {
			s.Source.CSV = &config.CSVSource{Path: filepath.Join(dir, "gone.csv")}
		} else {
			s.Source.CSV = &config.CSVSource{Path: writeFile(t, dir, "broken.csv", b.content)}
		}
		if b.set != nil {
			b.set(&s)
		}
		_, err := syncer.Sync(ctx, &s)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: sync error %v, want one containing %q", b.name, err, b.want)
			continue
		}
		// The rows' contents never appear in the error.
		if strings.Contains(err.Error(), "GLU") {
			t.Errorf("%s: error quotes row contents: %v", b.name, err)
		}
		infos, err := reference.ReferenceSets(ctx, db.Pool, []string{"lab-codes"})
		if err != nil {
			t.Fatal(err)
		}
		if infos[0].Version != good.Version || infos[0].Rows != 1 || !strings.Contains(infos[0].LastError, b.want) {
			t.Errorf("%s: set after failed sync %+v, want version %d kept and the error recorded", b.name, infos[0], good.Version)
		}
		if r := lastRun(t, db, "lab-codes"); r.Outcome != maintenance.RunFailed || !strings.Contains(r.Error, b.want) {
			t.Errorf("%s: audited run %+v, want failed with the reason", b.name, r)
		}
		refresh(t, c)
		if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
			t.Errorf("%s: lookup after failed sync %q, want the last good value", b.name, got)
		}
	}

	// The next good sync clears the recorded error.
	syncOK(t, syncer, set)
	infos, _ := reference.ReferenceSets(ctx, db.Pool, []string{"lab-codes"})
	if infos[0].LastError != "" {
		t.Errorf("error still recorded after a good sync: %q", infos[0].LastError)
	}
}

func TestSyncSQL(t *testing.T) {
	ctx := context.Background()
	db, syncer := newSyncer(t)
	lims := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := lims.Pool.Exec(ctx, `
		CREATE TABLE lab_map (code text, loinc text, factor numeric);
		INSERT INTO lab_map VALUES ('GLU', '2345-7', 1.5), ('NA', '2951-2', NULL)`); err != nil {
		t.Fatal(err)
	}
	set := &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{SQL: &config.SQLSource{
		DatabaseURL: lims.URL, Query: "select code, loinc, factor from lab_map", Timeout: 10 * time.Second,
	}}}
	syncOK(t, syncer, set)
	c := newCache(t, db)
	expect(t, c, "GLU", "", "2345-7")
	expect(t, c, "GLU", "factor", "1.5") // a numeric column as its text
	expect(t, c, "NA", "factor", "")     // NULL as empty

	// A failing query keeps the snapshot.
	set.Source.SQL.Query = "select code, loinc from no_such_table"
	syncFails(t, syncer, set, "no_such_table")
	expect(t, c, "GLU", "", "2345-7")
}

func TestSyncHTTP(t *testing.T) {
	ctx := context.Background()
	db, syncer := newSyncer(t)
	var body, contentType atomic.Value
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType.Load().(string))
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	set := &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{HTTP: &config.HTTPSource{
		URL: srv.URL + "/codes?token=secret", Timeout: 5 * time.Second,
	}}}
	c := reference.NewCache(db.Pool, nil, nil)

	cases := []struct {
		name, ctype, body string
		key               string
		lookupKey, column string
		want              string
	}{
		{"csv by content type", "text/csv", "code,loinc\nGLU,2345-7\n", "", "GLU", "", "2345-7"},
		{"json object map", "application/json", `{"GLU": "2345-7", "NA": 2951}`, "", "NA", "", "2951"},
		{"json object of objects", "application/json; charset=utf-8", `{"GLU": {"loinc": "2345-7", "unit": "mg/dL"}}`, "", "GLU", "unit", "mg/dL"},
		{"json array", "application/json", `[{"code": "GLU", "loinc": "2345-7"}, {"code": "K", "loinc": "2823-3"}]`, "code", "K", "loinc", "2823-3"},
	}
	for _, tc := range cases {
		contentType.Store(tc.ctype)
		body.Store(tc.body)
		set.Key = tc.key
		if _, err := syncer.Sync(ctx, set); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		expect(t, c, tc.lookupKey, tc.column, tc.want)
	}

	// A server error keeps the last snapshot, and the recorded error does
	// not carry the URL's query string (tokens live there).
	status.Store(http.StatusServiceUnavailable)
	if err := syncFails(t, syncer, set, "503"); strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the URL's query: %v", err)
	}
	expect(t, c, "K", "loinc", "2823-3")

	// A timeout is a failed sync too.
	status.Store(http.StatusOK)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer slow.Close()
	set.Source.HTTP = &config.HTTPSource{URL: slow.URL, Timeout: 200 * time.Millisecond}
	syncFails(t, syncer, set, "deadline")
	expect(t, c, "K", "loinc", "2823-3")
}

// TestSecondCacheReadsThrough is the cluster behaviour: a set synced through
// one node is served by another node's cache after its next refresh, loaded
// from the database and not from the source.
func TestSecondCacheReadsThrough(t *testing.T) {
	ctx := context.Background()
	db, syncer := newSyncer(t)
	dir := t.TempDir()
	set := csvSet(t, dir, "code,loinc\nGLU,old\n")
	syncOK(t, syncer, set)
	nodeA, nodeB := newCache(t, db), newCache(t, db)

	writeFile(t, dir, "lab.csv", "code,loinc\nGLU,new\n")
	syncOK(t, syncer, set)
	// The source is gone: whatever node B serves now came from the
	// database.
	if err := os.Remove(set.Source.CSV.Path); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, nodeB, "lab-codes", "GLU", ""); got != "old" {
		t.Errorf("before refresh B serves %q, want the snapshot it holds", got)
	}
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	go nodeB.Watch(watchCtx, 50*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for lookup(t, nodeB, "lab-codes", "GLU", "") != "new" {
		if time.Now().After(deadline) {
			t.Fatal("node B never served the new snapshot")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Refreshing with nothing new loads nothing.
	loaded, err := nodeA.Refresh(ctx)
	if err != nil || len(loaded) != 1 {
		t.Fatalf("A's refresh loaded %v, %v; want the one changed set", loaded, err)
	}
	if loaded, err := nodeA.Refresh(ctx); err != nil || len(loaded) != 0 {
		t.Errorf("second refresh loaded %v, %v; want nothing", loaded, err)
	}
}

func TestLookupWithoutSnapshot(t *testing.T) {
	c := newCache(t, testcontainers.NewDB(t))
	_, _, err := c.Lookup("lab-codes", "GLU", "")
	if err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Fatalf("lookup in a never-synced set: %v, want ErrNoSnapshot", err)
	}
}
