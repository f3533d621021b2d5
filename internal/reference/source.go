// Package reference serves reference-set lookups from memory on every node
// and materializes reference sets from their sources. It owns the stored
// snapshots (mefor_reference_set, mefor_reference_row).
//
// A sync (Sync, run by the reference-sync job on whichever node River hands
// it to) reads a set's source and writes a new snapshot to the database in
// one transaction. A Cache on every node polls the snapshot versions once per
// heartbeat and loads a set's rows from the database, never from the source,
// when its version changed; lookups never touch the database.
package reference

import (
	"context"
	"crypto/tls"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/dbtls"
	"github.com/mefor/mefor/internal/egress"
)

// maxSourceBytes bounds what an HTTP source may return: every node holds
// the whole set in memory, so a runaway response must fail the sync rather
// than the nodes.
const maxSourceBytes = 64 << 20

// table is a source's content before the set's key and value columns are
// picked from it.
type table struct {
	header  []string
	records [][]string
	// rowName names record i in errors, e.g. "line 4" for a CSV file.
	rowName func(i int) string
}

// Egress is how a read reaches a source on another machine.
type Egress struct {
	// HTTP is the client of an http source; an http source is not read
	// without one.
	HTTP *http.Client
	// Dial opens a sql source's connections; nil dials directly.
	Dial egress.DialFunc
}

// EgressTarget is how a reference set is named in egress refusals and in
// mefor_egress_refused_total.
func EgressTarget(set string) string { return "reference_set:" + set }

// EgressOf is how set's source is reached under policy p (nil: anywhere):
// an http source's client is p's (egress.Policy.HTTPClient) with tc, the
// source's TLS configuration (nil: the system's roots), and its proxy, if
// it names one; a sql source's connections are dialled through p, checked
// against the pins of the hosts of its URL.
func EgressOf(p *egress.Policy, tc *tls.Config, set *config.ReferenceSet) Egress {
	target := EgressTarget(set.Name)
	var e Egress
	if h := set.Source.HTTP; h != nil {
		o := egress.HTTPOptions{TLS: tc}
		var err error
		if h.Proxy != "" {
			// Checked by config; one that does not parse leaves the source
			// without a client, so the read fails rather than go direct.
			o.Proxy, err = url.Parse(h.Proxy)
		}
		if err == nil {
			e.HTTP = p.HTTPClient(target, o)
		}
	}
	if s := set.Source.SQL; s != nil {
		e.Dial = p.Dialer(target, config.SQLHosts(s.DatabaseURL)...)
	}
	return e
}

// Read reads set's source, reached as e says, and returns its rows as a
// snapshot. Errors name the source and the row or column at fault, never
// a value from the rows, nor a header.
func Read(ctx context.Context, set *config.ReferenceSet, e Egress) (ReferenceSnapshot, error) {
	var t table
	var err error
	src := set.Source
	switch {
	case src.CSV != nil:
		t, err = readCSVFile(src.CSV.Path)
	case src.SQL != nil:
		t, err = readSQL(ctx, src.SQL, e.Dial)
	case src.HTTP != nil:
		t, err = readHTTP(ctx, src.HTTP, set, e.HTTP)
	default:
		err = errors.New("the set has no source")
	}
	if err != nil {
		return ReferenceSnapshot{}, fmt.Errorf("%s: %w", src, err)
	}
	snap, err := pick(set, t)
	if err != nil {
		return ReferenceSnapshot{}, fmt.Errorf("%s: %w", src, err)
	}
	snap.Source = src.String()
	return snap, nil
}

// pick builds the snapshot from t: the key column (named, or the first) and
// the value columns (named, or all others). Empty and repeated keys fail
// the read: either would make lookups silently depend on row order.
func pick(set *config.ReferenceSet, t table) (ReferenceSnapshot, error) {
	if len(t.header) == 0 {
		return ReferenceSnapshot{}, errors.New("has no columns")
	}
	col := func(name string) int { return slices.Index(t.header, name) }
	key := 0
	if set.Key != "" {
		if key = col(set.Key); key < 0 {
			return ReferenceSnapshot{}, fmt.Errorf("has no key column %q (columns: %s)", set.Key, strings.Join(t.header, ", "))
		}
	}
	var idx []int
	var columns []string
	if len(set.Values) > 0 {
		for _, v := range set.Values {
			i := col(v)
			if i < 0 {
				return ReferenceSnapshot{}, fmt.Errorf("has no value column %q (columns: %s)", v, strings.Join(t.header, ", "))
			}
			idx, columns = append(idx, i), append(columns, v)
		}
	} else {
		for i, h := range t.header {
			if i != key {
				idx, columns = append(idx, i), append(columns, h)
			}
		}
	}
	if len(columns) == 0 {
		return ReferenceSnapshot{}, fmt.Errorf("has only the key column %q; a reference set needs at least one value column", t.header[key])
	}
	snap := ReferenceSnapshot{Columns: columns, Rows: make([]ReferenceRow, 0, len(t.records))}
	seen := make(map[string]int, len(t.records))
	for r, rec := range t.records {
		k := rec[key]
		if k == "" {
			return ReferenceSnapshot{}, fmt.Errorf("%s has an empty key", t.rowName(r))
		}
		if first, dup := seen[k]; dup {
			return ReferenceSnapshot{}, fmt.Errorf("%s repeats the key of %s; keys must be unique", t.rowName(r), t.rowName(first))
		}
		seen[k] = r
		values := make([]string, len(idx))
		for j, i := range idx {
			values[j] = rec[i]
		}
		snap.Rows = append(snap.Rows, ReferenceRow{Key: k, Values: values})
	}
	if len(snap.Rows) == 0 && !set.AllowEmpty {
		return ReferenceSnapshot{}, errors.New("has no rows; the last snapshot is kept (set allow_empty: true if the set may really be empty)")
	}
	return snap, nil
}

func readCSVFile(path string) (table, error) {
	f, err := os.Open(path)
	if err != nil {
		return table{}, err
	}
	defer f.Close()
	return readCSV(f)
}

func readCSV(r io.Reader) (table, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return table{}, errors.New("is empty; it needs a header row naming the columns")
	}
	if err != nil {
		return table{}, csvError(err)
	}
	if len(header) > 0 {
		header[0] = strings.TrimPrefix(header[0], "\ufeff") // a BOM from spreadsheet exports
	}
	for i, h := range header {
		header[i] = strings.TrimSpace(h)
		if header[i] == "" {
			return table{}, fmt.Errorf("header column %d is blank; name every column", i+1)
		}
		if slices.Index(header, header[i]) < i {
			return table{}, fmt.Errorf("header names column %q twice", header[i])
		}
	}
	t := table{header: header}
	var lines []int
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return table{}, csvError(err)
		}
		line, _ := cr.FieldPos(0)
		t.records = append(t.records, rec)
		lines = append(lines, line)
	}
	t.rowName = func(i int) string { return fmt.Sprintf("line %d", lines[i]) }
	return t, nil
}

// csvError keeps the position and kind of a CSV parse error; encoding/csv
// does not quote field contents in them.
func csvError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("line %d: %v", pe.Line, pe.Err)
	}
	return err
}

func readSQL(ctx context.Context, src *config.SQLSource, dial egress.DialFunc) (table, error) {
	ctx, cancel := context.WithTimeout(ctx, src.Timeout)
	defer cancel()
	cc, err := pgx.ParseConfig(src.DatabaseURL)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return table{}, errors.New("connect: database_url is not a valid PostgreSQL URL")
	}
	if !src.AllowInsecureDatabase {
		// Config validation refuses such a URL already; this holds for a
		// source built any other way.
		var ie *dbtls.InsecureError
		if err := dbtls.Check(&cc.Config, src.DatabaseURL); errors.As(err, &ie) {
			return table{}, fmt.Errorf("refused: database_url %v; %s, or set allow_insecure_database: true on the source", ie, ie.Fix())
		}
	}
	if dial != nil {
		// pgx resolves the URL's hosts and dials their addresses; the
		// policy checks each against the hosts' pins.
		cc.DialFunc = pgconn.DialFunc(dial)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	var refused *egress.RefusedError
	switch {
	case errors.As(err, &refused):
		return table{}, fmt.Errorf("connect: %w", refused)
	case err != nil:
		return table{}, fmt.Errorf("connect: %w", redactConnError(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Text results: a value column of any type (numeric, date, ...) reads
	// as the text the database prints for it.
	rows, err := conn.Query(ctx, src.Query, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return table{}, fmt.Errorf("query: %w", err)
	}
	defer rows.Close()
	var t table
	for _, fd := range rows.FieldDescriptions() {
		t.header = append(t.header, fd.Name)
	}
	if hasDuplicate(t.header) {
		return table{}, errors.New("query returns two columns with the same name; alias them (select a as code, b as loinc ...)")
	}
	for rows.Next() {
		raw := rows.RawValues()
		rec := make([]string, len(raw))
		for i, v := range raw {
			rec[i] = string(v) // NULL reads as ""
		}
		t.records = append(t.records, rec)
	}
	if err := rows.Err(); err != nil {
		return table{}, fmt.Errorf("query: %w", err)
	}
	t.rowName = func(i int) string { return fmt.Sprintf("result row %d", i+1) }
	return t, nil
}

func hasDuplicate(names []string) bool {
	s := slices.Sorted(slices.Values(names))
	return len(slices.Compact(s)) != len(names)
}

// redactConnError drops what pgx puts in connection errors beyond the host:
// its config echo may include the user, never the password, but keep it
// short and predictable for the audit.
func redactConnError(err error) error {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 && strings.HasPrefix(msg, "failed to connect to") {
		return errors.New("failed to connect: " + msg[i+2:])
	}
	return err
}

func readHTTP(ctx context.Context, src *config.HTTPSource, set *config.ReferenceSet, client *http.Client) (table, error) {
	if client == nil {
		return table{}, errors.New("GET: no HTTP client was given for this source")
	}
	ctx, cancel := context.WithTimeout(ctx, src.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.URL, nil)
	if err != nil {
		return table{}, errors.New("bad URL")
	}
	req.Header.Set("Accept", "text/csv, application/json;q=0.9")
	for _, h := range src.Headers {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := client.Do(req)
	if err != nil {
		var uerr interface{ Unwrap() error }
		if errors.As(err, &uerr) {
			err = uerr.Unwrap() // *url.Error repeats the URL, query string included
		}
		return table{}, fmt.Errorf("GET: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return table{}, fmt.Errorf("GET: status %s", resp.Status)
	}
	body := io.LimitReader(resp.Body, maxSourceBytes+1)
	data, err := io.ReadAll(body)
	if err != nil {
		return table{}, fmt.Errorf("GET: read body: %w", err)
	}
	if len(data) > maxSourceBytes {
		return table{}, fmt.Errorf("GET: response is larger than %d MiB", maxSourceBytes>>20)
	}
	format := src.Format
	if format == "" {
		format = config.FormatCSV
		if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
			format = config.FormatJSON
		}
	}
	if format == config.FormatJSON {
		return readJSON(data, set)
	}
	return readCSV(strings.NewReader(string(data)))
}

// readJSON reads an array of objects (one per row, fields as columns) or an
// object mapping each key to a value (a column named like the set's only
// value column, else "value") or to an object of value columns.
func readJSON(data []byte, set *config.ReferenceSet) (table, error) {
	var doc any
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return table{}, fmt.Errorf("not valid JSON: %v", syntaxOnly(err))
	}
	switch doc := doc.(type) {
	case []any:
		return jsonArray(doc, set)
	case map[string]any:
		return jsonObject(doc, set)
	}
	return table{}, errors.New("JSON must be an array of objects or an object mapping keys to values")
}

func syntaxOnly(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("syntax error at byte %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("unexpected %s at byte %d", te.Value, te.Offset)
	}
	return errors.New("malformed document")
}

func jsonArray(items []any, set *config.ReferenceSet) (table, error) {
	if set.Key == "" && len(items) > 0 {
		return table{}, errors.New("is a JSON array of objects; set key: to name the field looked up")
	}
	fields := map[string]bool{}
	objs := make([]map[string]any, len(items))
	for i, it := range items {
		o, ok := it.(map[string]any)
		if !ok {
			return table{}, fmt.Errorf("item %d is not an object", i+1)
		}
		objs[i] = o
		for f := range o {
			fields[f] = true
		}
	}
	// Objects have no column order: the key first, the others sorted, so
	// "the first value column" is the same on every sync.
	header := []string{set.Key}
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if f != set.Key {
			header = append(header, f)
		}
	}
	t := table{header: header, rowName: func(i int) string { return fmt.Sprintf("item %d", i+1) }}
	for i, o := range objs {
		rec := make([]string, len(header))
		for j, h := range header {
			s, err := jsonText(o[h])
			if err != nil {
				return table{}, fmt.Errorf("item %d field %q %v", i+1, h, err)
			}
			rec[j] = s
		}
		t.records = append(t.records, rec)
	}
	return t, nil
}

func jsonObject(m map[string]any, set *config.ReferenceSet) (table, error) {
	keyCol := set.Key
	if keyCol == "" {
		keyCol = "key"
	}
	keys := slices.Sorted(maps.Keys(m))
	fields := map[string]bool{}
	nested := false
	for _, k := range keys {
		if o, ok := m[k].(map[string]any); ok {
			nested = true
			for f := range o {
				fields[f] = true
			}
		}
	}
	header := []string{keyCol}
	if nested {
		for _, f := range slices.Sorted(maps.Keys(fields)) {
			if f != keyCol {
				header = append(header, f)
			}
		}
	} else {
		valueCol := "value"
		if len(set.Values) == 1 {
			valueCol = set.Values[0]
		}
		header = append(header, valueCol)
	}
	t := table{header: header, rowName: func(i int) string { return fmt.Sprintf("entry %d", i+1) }}
	for i, k := range keys {
		rec := []string{k}
		if nested {
			o, ok := m[k].(map[string]any)
			if !ok {
				return table{}, fmt.Errorf("entry %d is not an object like the others", i+1)
			}
			for _, h := range header[1:] {
				s, err := jsonText(o[h])
				if err != nil {
					return table{}, fmt.Errorf("entry %d field %q %v", i+1, h, err)
				}
				rec = append(rec, s)
			}
		} else {
			s, err := jsonText(m[k])
			if err != nil {
				return table{}, fmt.Errorf("entry %d %v", i+1, err)
			}
			rec = append(rec, s)
		}
		t.records = append(t.records, rec)
	}
	return t, nil
}

// jsonText renders a scalar JSON value as text: numbers as written, null as
// empty. Nested structures have no text form for an HL7 field.
func jsonText(v any) (string, error) {
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		if v {
			return "true", nil
		}
		return "false", nil
	}
	return "", errors.New("is a nested object or array; values must be text, numbers or booleans")
}
