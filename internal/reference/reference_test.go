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

func csvSet(path string) *config.ReferenceSet {
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
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "lab.csv", "\ufefflocal_code,loinc,display\nGLU,2345-7,Glucose\nNA,2951-2,\"Sodium, serum\"\n")
	set := csvSet(path)
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}

	res, err := syncer.Sync(ctx, set)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 2 || res.Version == 0 {
		t.Fatalf("sync result %+v, want 2 rows and a version", res)
	}
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Errorf("GLU -> %q, want the first value column 2345-7", got)
	}
	if got := lookup(t, c, "lab-codes", "NA", "display"); got != "Sodium, serum" {
		t.Errorf("NA display -> %q, want the quoted CSV value", got)
	}
	if got := lookup(t, c, "lab-codes", "K", ""); got != "<miss>" {
		t.Errorf("K -> %q, want a miss", got)
	}
	if _, _, err := c.Lookup("lab-codes", "GLU", "units"); err == nil || !strings.Contains(err.Error(), `no column "units"`) {
		t.Errorf("unknown column: %v", err)
	}
	if r := lastRun(t, db, "lab-codes"); r.Outcome != maintenance.RunOK || r.NodeID != "n1" {
		t.Errorf("audited run %+v, want ok by n1", r)
	}

	// Named key and value columns pick and order the columns.
	set.Key, set.Values = "loinc", []string{"display"}
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "2951-2", ""); got != "Sodium, serum" {
		t.Errorf("by loinc -> %q", got)
	}
}

func TestFailedSyncKeepsLastSnapshot(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "lab.csv", "code,loinc\nGLU,2345-7\n")
	set := csvSet(path)
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}
	good, err := syncer.Sync(ctx, set)
	if err != nil {
		t.Fatal(err)
	}
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

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
		if _, err := c.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
			t.Errorf("%s: lookup after failed sync %q, want the last good value", b.name, got)
		}
	}

	// The next good sync clears the recorded error.
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatal(err)
	}
	infos, _ := reference.ReferenceSets(ctx, db.Pool, []string{"lab-codes"})
	if infos[0].LastError != "" {
		t.Errorf("error still recorded after a good sync: %q", infos[0].LastError)
	}
}

func TestSyncSQL(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	lims := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := lims.Pool.Exec(ctx, `
		CREATE TABLE lab_map (code text, loinc text, factor numeric);
		INSERT INTO lab_map VALUES ('GLU', '2345-7', 1.5), ('NA', '2951-2', NULL)`); err != nil {
		t.Fatal(err)
	}
	set := &config.ReferenceSet{Name: "lab-codes", Source: config.ReferenceSource{SQL: &config.SQLSource{
		DatabaseURL: lims.URL, Query: "select code, loinc, factor from lab_map", Timeout: 10 * time.Second,
	}}}
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatal(err)
	}
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Errorf("GLU -> %q", got)
	}
	if got := lookup(t, c, "lab-codes", "GLU", "factor"); got != "1.5" {
		t.Errorf("numeric column -> %q, want its text 1.5", got)
	}
	if got := lookup(t, c, "lab-codes", "NA", "factor"); got != "" {
		t.Errorf("NULL -> %q, want empty", got)
	}

	// A failing query keeps the snapshot.
	set.Source.SQL.Query = "select code, loinc from no_such_table"
	if _, err := syncer.Sync(ctx, set); err == nil || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("bad query: %v", err)
	}
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, c, "lab-codes", "GLU", ""); got != "2345-7" {
		t.Errorf("after failed query GLU -> %q", got)
	}
}

func TestSyncHTTP(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
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
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}
	c := reference.NewCache(db.Pool, nil, nil)
	check := func(key, column, want string) {
		t.Helper()
		if _, err := c.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if got := lookup(t, c, "lab-codes", key, column); got != want {
			t.Errorf("%s/%s -> %q, want %q", key, column, got, want)
		}
	}

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
		check(tc.lookupKey, tc.column, tc.want)
	}

	// A server error keeps the last snapshot, and the recorded error does
	// not carry the URL's query string (tokens live there).
	status.Store(http.StatusServiceUnavailable)
	_, err := syncer.Sync(ctx, set)
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503: %v", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the URL's query: %v", err)
	}
	check("K", "loinc", "2823-3")

	// A timeout is a failed sync too.
	status.Store(http.StatusOK)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer slow.Close()
	set.Source.HTTP = &config.HTTPSource{URL: slow.URL, Timeout: 200 * time.Millisecond}
	if _, err := syncer.Sync(ctx, set); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("timeout: %v", err)
	}
	check("K", "loinc", "2823-3")
}

// TestSecondCacheReadsThrough is the cluster behaviour: a set synced through
// one node is served by another node's cache after its next refresh, loaded
// from the database and not from the source.
func TestSecondCacheReadsThrough(t *testing.T) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "lab.csv", "code,loinc\nGLU,old\n")
	set := csvSet(path)
	syncer := &reference.Syncer{Pool: db.Pool, NodeID: "n1"}
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatal(err)
	}
	nodeA := reference.NewCache(db.Pool, nil, nil)
	nodeB := reference.NewCache(db.Pool, nil, nil)
	for _, c := range []*reference.Cache{nodeA, nodeB} {
		if _, err := c.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}

	writeFile(t, dir, "lab.csv", "code,loinc\nGLU,new\n")
	if _, err := syncer.Sync(ctx, set); err != nil {
		t.Fatal(err)
	}
	// The source is gone: whatever node B serves now came from the
	// database.
	if err := os.Remove(path); err != nil {
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
	db := testcontainers.NewDB(t)
	c := reference.NewCache(db.Pool, nil, nil)
	if _, err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.Lookup("lab-codes", "GLU", "")
	if err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Fatalf("lookup in a never-synced set: %v, want ErrNoSnapshot", err)
	}
}
