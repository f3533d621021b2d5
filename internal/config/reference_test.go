package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

// refDoc is a valid config with a lookup; tests append reference_sets.
const refDoc = `
channels:
  lab:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - handler: loinc
        destinations: [out]
handlers:
  loinc:
    type: map
    map:
      - lookup: {from: OBX-3.1, set: lab-codes, column: loinc, on_miss: default, default: UNMAPPED}
destinations:
  out:
    type: file
    file: {directory: ./out}
`

func TestReferenceSetsParse(t *testing.T) {
	cfg, err := parse(t, refDoc+`
reference_sets:
  lab-codes:
    refresh: "0 3 * * *"
    key: local
    values: [loinc, display]
    source:
      sql: {database_url: "${LIMS_URL}", query: "select local, loinc, display from map"}
  units:
    source:
      http: {url: "https://user:pw@terms.example.org/units.json?token=t", format: json}
    key: code
`, map[string]string{"LIMS_URL": "postgres://u:secret@lims/db?sslmode=verify-full&sslrootcert=/nonexistent/lims-ca.crt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ReferenceSets) != 2 {
		t.Fatalf("got %d sets", len(cfg.ReferenceSets))
	}
	lab := cfg.ReferenceSet("lab-codes")
	if lab.Key != "local" || strings.Join(lab.Values, ",") != "loinc,display" || lab.Refresh.String() != "0 3 * * *" {
		t.Errorf("lab-codes: %+v", lab)
	}
	if !strings.HasPrefix(lab.Source.SQL.DatabaseURL, "postgres://u:secret@lims/db?") || lab.Source.SQL.Timeout != 30*time.Second {
		t.Errorf("sql source: %+v", lab.Source.SQL)
	}
	// Descriptions never carry passwords or tokens.
	if s := lab.Source.String(); s != "sql postgres://lims/db" {
		t.Errorf("sql source described as %q", s)
	}
	units := cfg.ReferenceSet("units")
	if s := units.Source.String(); s != "http https://terms.example.org/units.json" {
		t.Errorf("http source described as %q", s)
	}
	if d, ok := units.Refresh.Interval(); !ok || d != time.Hour {
		t.Errorf("default refresh %v", units.Refresh)
	}
	op := cfg.Handler("loinc").Map[0]
	if op.Kind != config.MapLookup || op.From != "OBX-3.1" || op.Target != "OBX-3.1" || op.Set != "lab-codes" ||
		op.Column != "loinc" || op.OnMiss != config.OnMissDefault || op.Value != "UNMAPPED" {
		t.Errorf("lookup op %+v", op)
	}
}

func TestLookupDefaultsToDeadLetter(t *testing.T) {
	cfg, err := parse(t, strings.Replace(refDoc, ", column: loinc, on_miss: default, default: UNMAPPED", ", to: OBX-3.3", 1)+`
reference_sets:
  lab-codes:
    source: {csv: {path: ./lab.csv}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	op := cfg.Handler("loinc").Map[0]
	if op.OnMiss != config.OnMissDeadLetter || op.Target != "OBX-3.3" {
		t.Errorf("lookup op %+v, want on_miss dead-letter and to OBX-3.3", op)
	}
}

func TestReferenceSetValidation(t *testing.T) {
	tests := []struct {
		name string
		sets string
		want []wantErr
	}{
		{"unknown set in a lookup", `
  lab-kodes:
    source: {csv: {path: ./lab.csv}}
`, []wantErr{
			{12, "handlers.loinc.map[0].lookup.set", `"lab-codes" is not defined (declare it under reference_sets:); did you mean "lab-kodes"?`},
		}},
		{"missing source", `
  lab-codes:
    refresh: 1h
`, []wantErr{
			{18, "reference_sets.lab-codes.source", "is required: where the rows come from"},
		}},
		{"two sources", `
  lab-codes:
    source:
      csv: {path: ./lab.csv}
      http: {url: https://x.example.org/a.csv}
`, []wantErr{
			{19, "reference_sets.lab-codes.source", "has csv and http; a reference set reads one source"},
		}},
		{"bad columns", `
  lab-codes:
    key: code
    values: [loinc, code, loinc]
    source: {csv: {path: ./lab.csv}}
`, []wantErr{
			{20, "reference_sets.lab-codes.values[1]", `"code" is the key column`},
			{20, "reference_sets.lab-codes.values[2]", `"loinc" is listed twice`},
		}},
		{"column not among values", `
  lab-codes:
    values: [snomed]
    source: {csv: {path: ./lab.csv}}
`, []wantErr{
			{12, "handlers.loinc.map[0].lookup.column", `"loinc" is not one of the values of reference set "lab-codes" (snomed)`},
		}},
		{"bad sources", `
  lab-codes:
    source: {csv: {}}
  b:
    refresh: 15
    source: {sql: {database_url: "mysql://u:pw@h/db", query: " "}}
  c:
    source: {http: {url: "ftp://x/y", format: xml, timeout: 0s}}
`, []wantErr{
			{19, "reference_sets.lab-codes.source.csv.path", "is required: the CSV file"},
			{22, "reference_sets.b", "is not used by any lookup"},
			{21, "reference_sets.b.refresh", `"15" needs a unit`},
			{22, "reference_sets.b.source.sql.database_url", "must be a postgres:// URL"},
			{22, "reference_sets.b.source.sql.query", "is required"},
			{25, "reference_sets.c", "is not used by any lookup"},
			{24, "reference_sets.c.source.http.url", "must be an http:// or https:// URL"},
			{24, "reference_sets.c.source.http.format", `"xml" is not a format`},
			{24, "reference_sets.c.source.http.timeout", "must be > 0"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, refDoc+"reference_sets:"+tt.sets, nil)
			if err == nil {
				t.Fatal("parsed without error")
			}
			// Warnings are only returned with a successful parse; keep
			// the errors of the wanted list.
			var want []wantErr
			for _, w := range tt.want {
				if !strings.Contains(w.msg, "not used by any lookup") {
					want = append(want, w)
				}
			}
			checkErrs(t, err, want)
			// No error quotes a password.
			if strings.Contains(err.Error(), "pw@") {
				t.Errorf("error quotes the database URL: %v", err)
			}
		})
	}
}

func TestLookupMissPolicyValidation(t *testing.T) {
	doc := strings.Replace(refDoc, "on_miss: default, default: UNMAPPED", "on_miss: drop", 1) + `
reference_sets:
  lab-codes:
    source: {csv: {path: ./lab.csv}}
`
	_, err := parse(t, doc, nil)
	checkErrs(t, err, []wantErr{{12, "handlers.loinc.map[0].lookup.on_miss", `"drop" is not a miss policy (one of keep, default, dead-letter)`}})

	doc = strings.Replace(refDoc, "on_miss: default, default: UNMAPPED", "default: X", 1) + `
reference_sets:
  lab-codes:
    source: {csv: {path: ./lab.csv}}
`
	_, err = parse(t, doc, nil)
	checkErrs(t, err, []wantErr{{12, "handlers.loinc.map[0].lookup.default", "only applies to on_miss: default"}})
}

// A SQL source's database_url obeys the rule DATABASE_URL does (package
// dbtls): another host is reached only over TLS that cannot fall back to
// plaintext, unless the source says allow_insecure_database: true.
func TestSQLSourceDatabaseTLSRule(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tt := range []struct {
		url, extra string
		says       string // "" means allowed
	}{
		{url: "postgres://u:s3cret@lims.example.org/db", says: "connects to lims.example.org with no sslmode (pgx then uses prefer"},
		{url: "postgres://u:s3cret@lims.example.org/db?sslmode=prefer", says: "sslmode=prefer, which falls back to plaintext"},
		{url: "postgres://u:s3cret@10.1.2.3:5432/db?sslmode=disable", says: "connects to 10.1.2.3 with sslmode=disable"},
		{url: "postgres://u:s3cret@127.0.0.1,lims.example.org/db?sslmode=disable", says: "connects to lims.example.org"},
		// The CA file is not read to apply the rule: config check works
		// where it is absent.
		{url: "postgres://u:s3cret@lims.example.org/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt"},
		{url: "postgres://u:s3cret@lims.example.org/db?sslmode=require"},
		{url: "postgres://u:s3cret@127.0.0.1:5432/db?sslmode=disable"},
		{url: "postgres://u:s3cret@localhost/db"},
		{url: "postgres://u:s3cret@lims.example.org/db?sslmode=disable", extra: ", allow_insecure_database: true"},
	} {
		doc := refDoc + `
reference_sets:
  lab-codes:
    source:
      sql: {database_url: "${LIMS_URL}", query: "select local, loinc from map"` + tt.extra + `}
`
		_, err := parse(t, doc, map[string]string{"LIMS_URL": tt.url})
		if tt.says == "" {
			if err != nil {
				t.Errorf("%s%s refused: %v", tt.url, tt.extra, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s allowed, want it refused", tt.url)
			continue
		}
		checkErrs(t, err, []wantErr{{21, "reference_sets.lab-codes.source.sql.database_url", tt.says}})
		for _, fix := range []string{"sslmode=verify-full&sslrootcert=", "allow_insecure_database: true"} {
			if !strings.Contains(err.Error(), fix) {
				t.Errorf("%s: the error does not say %q: %v", tt.url, fix, err)
			}
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", tt.url, err)
		}
	}
}
