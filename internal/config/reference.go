package config

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/dbtls"
)

// ReferenceSet is a code-mapping table, such as local lab codes to LOINC,
// that map handlers translate fields through. Its rows come from Source; the
// reference-sync job copies them into a database snapshot on the Refresh
// schedule, and every node serves lookups from its in-memory copy of the
// latest snapshot, never from the source.
type ReferenceSet struct {
	Name string
	// Refresh says when the set is synced from its source. Defaults to
	// every hour.
	Refresh Schedule
	Source  ReferenceSource
	// Key is the column holding the code looked up. Empty means the first
	// column of the source (CSV header, SQL result); JSON arrays of objects
	// need it named.
	Key string
	// Values are the columns kept for each key, the first being the one a
	// lookup returns unless it names another. Empty means every column but
	// the key.
	Values []string
	// AllowEmpty lets a sync whose source has no rows replace the snapshot.
	// Off by default: an empty file or result is far more often a broken
	// export than a table meant to be empty, and replacing the snapshot
	// with it would turn every lookup into a miss.
	AllowEmpty bool
}

// ReferenceSource says where a reference set's rows come from. Exactly one
// field is set after loading.
type ReferenceSource struct {
	CSV  *CSVSource
	SQL  *SQLSource
	HTTP *HTTPSource
}

// Kind names the kind of source that is set: csv, sql or http.
func (s ReferenceSource) Kind() string {
	switch {
	case s.CSV != nil:
		return "csv"
	case s.SQL != nil:
		return "sql"
	case s.HTTP != nil:
		return "http"
	}
	return ""
}

// String describes the source without secrets, for logs and listings: the
// file, the database host and name, or the URL without credentials or query.
func (s ReferenceSource) String() string {
	switch {
	case s.CSV != nil:
		return "csv " + s.CSV.Path
	case s.SQL != nil:
		return "sql " + redactURL(s.SQL.DatabaseURL)
	case s.HTTP != nil:
		return "http " + redactURL(s.HTTP.URL)
	}
	return ""
}

// redactURL keeps scheme, host and path of a URL: user info and query
// strings often carry passwords or tokens.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// CSVSource reads a CSV file with a header row.
type CSVSource struct {
	// Path is relative to mefor's working directory, like a file
	// destination's directory.
	Path string
}

// SQLSource runs a query against a PostgreSQL database.
type SQLSource struct {
	// DatabaseURL is a PostgreSQL connection URL; write the password as
	// ${VAR} so it stays out of the file.
	DatabaseURL string
	// Query returns the key column and the value columns.
	Query string
	// Timeout bounds one sync's read, connecting included. Defaults to 30s.
	Timeout time.Duration
	// AllowInsecureDatabase lifts the database TLS rule (package dbtls)
	// for this source alone: the config is every node's, so the choice is
	// written once here rather than left to each node's flags.
	AllowInsecureDatabase bool
}

// HTTPSource fetches CSV or JSON with a GET.
type HTTPSource struct {
	URL string
	// Format is csv or json; empty picks by the response's Content-Type.
	Format string
	// Timeout bounds one sync's request and its answer. Defaults to 30s.
	Timeout time.Duration
	// Headers are sent with every request, in file order (a bearer
	// token, say). Their values never appear in logs or errors.
	Headers []HTTPHeader
	// TLS configures an https:// URL: the CAs the server must chain to
	// (the system's roots without it), a client certificate. The same
	// block as a destination's.
	TLS ClientTLS
	// Proxy is the URL of the HTTP proxy requests go through; empty
	// connects directly. The environment's proxy variables are never
	// used.
	Proxy string
	// Plaintext acknowledges an http:// URL to another machine, which is
	// otherwise flagged by `mefor config check` and `mefor status`.
	Plaintext bool
}

// Reference source formats of an HTTP source.
const (
	FormatCSV  = "csv"
	FormatJSON = "json"
)

const (
	defaultReferenceRefresh = time.Hour
	defaultSourceTimeout    = 30 * time.Second
)

// ReferenceSet returns the reference set with the given name, or nil.
func (c *Config) ReferenceSet(name string) *ReferenceSet {
	return find(c.ReferenceSets, func(s *ReferenceSet) bool { return s.Name == name })
}

func (l *loader) decodeReferenceSet(name string, n *yaml.Node, p path) ReferenceSet {
	s := ReferenceSet{Name: name, Refresh: Every(defaultReferenceRefresh)}
	m := l.mapping(n, p, "refresh", "source", "key", "values", "allow_empty")
	l.schedule(m, p, "refresh", &s.Refresh)
	decodeScalar(l, m, p, "key", &s.Key, asString)
	l.strings(m, p, "values", &s.Values)
	decodeScalar(l, m, p, "allow_empty", &s.AllowEmpty, parseBool)

	sp := p.key("source")
	sm := l.mapping(m["source"], sp, "csv", "sql", "http")
	if cn, ok := sm["csv"]; ok {
		cp := sp.key("csv")
		s.Source.CSV = &CSVSource{}
		cm := l.mapping(cn, cp, "path")
		decodeScalar(l, cm, cp, "path", &s.Source.CSV.Path, asString)
	}
	if qn, ok := sm["sql"]; ok {
		qp := sp.key("sql")
		s.Source.SQL = &SQLSource{Timeout: defaultSourceTimeout}
		qm := l.mapping(qn, qp, "database_url", "query", "timeout", "allow_insecure_database")
		decodeScalar(l, qm, qp, "database_url", &s.Source.SQL.DatabaseURL, asString)
		decodeScalar(l, qm, qp, "allow_insecure_database", &s.Source.SQL.AllowInsecureDatabase, parseBool)
		decodeScalar(l, qm, qp, "query", &s.Source.SQL.Query, asString)
		decodeScalar(l, qm, qp, "timeout", &s.Source.SQL.Timeout, parseDuration)
	}
	if hn, ok := sm["http"]; ok {
		hp := sp.key("http")
		s.Source.HTTP = &HTTPSource{Timeout: defaultSourceTimeout}
		hm := l.mapping(hn, hp, "url", "format", "timeout", "headers", "tls", "proxy", "plaintext")
		h := s.Source.HTTP
		decodeScalar(l, hm, hp, "url", &h.URL, asString)
		decodeScalar(l, hm, hp, "format", &h.Format, asString)
		decodeScalar(l, hm, hp, "timeout", &h.Timeout, parseDuration)
		decodeScalar(l, hm, hp, "proxy", &h.Proxy, asString)
		decodeScalar(l, hm, hp, "plaintext", &h.Plaintext, parseBool)
		if n, ok := hm["headers"]; ok {
			h.Headers = l.decodeHeaders(n, hp.key("headers"))
		}
		if n, ok := hm["tls"]; ok {
			h.TLS = l.decodeClientTLS(n, hp.key("tls"))
		}
	}
	return s
}

func (l *loader) checkReferenceSets(c *Config) {
	// Lookups are checked here rather than with the other map edits
	// because they need the reference sets.
	used := make(map[string]bool)
	for _, h := range c.Handlers {
		for i, op := range h.Map {
			if op.Kind == MapLookup {
				used[op.Set] = true
				p := path{section: "handlers"}.entity(h.Name).key(string(HandlerMap)).index(i).key(string(MapLookup))
				l.checkLookup(c, op, p)
			}
		}
	}
	for i := range c.ReferenceSets {
		s := &c.ReferenceSets[i]
		p := path{section: "reference_sets"}.entity(s.Name)
		l.checkReferenceSource(s, p.key("source"))
		l.checkReferenceColumns(s, p)
		if !used[s.Name] && !scriptMentions(c, s.Name) {
			l.warnf(p, "is not used by any lookup")
		}
	}
}

func (l *loader) checkReferenceSource(s *ReferenceSet, p path) {
	src := s.Source
	var kinds []string
	for k, set := range map[string]bool{"csv": src.CSV != nil, "sql": src.SQL != nil, "http": src.HTTP != nil} {
		if set {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	switch {
	case len(kinds) == 0:
		l.errorf(p, "is required: where the rows come from, one of csv: {path: ./codes.csv}, sql: {database_url: ${LIMS_URL}, query: ...} or http: {url: https://...}")
		return
	case len(kinds) > 1:
		l.errorf(p, "has %s; a reference set reads one source, keep one of them", strings.Join(kinds, " and "))
		return
	}
	switch {
	case src.CSV != nil:
		if cp := p.key("csv").key("path"); src.CSV.Path == "" {
			l.errorf(cp, "is required: the CSV file, with a header row (e.g. path: ./reference/%s.csv; relative to mefor's working directory)", s.Name)
		}
	case src.SQL != nil:
		qp := p.key("sql")
		up := qp.key("database_url")
		switch {
		case !l.given(up):
			l.errorf(up, "is required: the PostgreSQL database to query, e.g. database_url: ${LIMS_DATABASE_URL}")
		case !strings.HasPrefix(src.SQL.DatabaseURL, "postgres://") && !strings.HasPrefix(src.SQL.DatabaseURL, "postgresql://"):
			// The value is not quoted: it may hold a password.
			l.errorf(up, "must be a postgres:// URL (e.g. database_url: ${LIMS_DATABASE_URL})")
		case !src.SQL.AllowInsecureDatabase:
			l.checkSourceTLS(up, src.SQL.DatabaseURL)
		}
		if strings.TrimSpace(src.SQL.Query) == "" {
			l.errorf(qp.key("query"), "is required: a query returning the key column first, then the value columns, e.g. query: select local_code, loinc from lab_map")
		}
		l.positive(qp, "timeout", src.SQL.Timeout, defaultSourceTimeout)
	case src.HTTP != nil:
		hp := p.key("http")
		up := hp.key("url")
		if !l.given(up) {
			l.errorf(up, "is required: the address returning CSV or JSON, e.g. url: https://terminology.example.org/lab-codes.csv")
		} else if u, err := url.Parse(src.HTTP.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			l.errorf(up, "must be an http:// or https:// URL with a host (e.g. url: https://terminology.example.org/lab-codes.csv)")
		} else {
			l.checkHTTPClient(hp, u, &src.HTTP.TLS, src.HTTP.Proxy, src.HTTP.Plaintext)
		}
		if f := src.HTTP.Format; f != "" && f != FormatCSV && f != FormatJSON {
			l.errorf(hp.key("format"), "%q is not a format; use csv or json, or leave it out to go by the response's Content-Type", f)
		}
		l.positive(hp, "timeout", src.HTTP.Timeout, defaultSourceTimeout)
	}
}

// checkSourceTLS applies the database TLS rule to a SQL source's URL, as
// every command applies it to DATABASE_URL. Only the URL's hosts and
// sslmode matter, so its certificate file parameters are left out of the
// parse: pgx would read the files, and config check must work where they
// are absent.
func (l *loader) checkSourceTLS(p path, raw string) {
	cfg, err := parseSourceURL(raw)
	if errors.Is(err, errNotURL) {
		// url.Parse's error quotes the URL, password included.
		l.errorf(p, "is not a valid URL; want postgres://user:password@host:port/dbname?sslmode=verify-full&sslrootcert=/path/to/db-ca.crt")
		return
	}
	if err != nil {
		l.errorf(p, "is not a PostgreSQL URL pgx can use (check its host, port and sslmode); want postgres://user:password@host:port/dbname?sslmode=verify-full&sslrootcert=/path/to/db-ca.crt")
		return
	}
	var ie *dbtls.InsecureError
	if err := dbtls.Check(cfg, raw); errors.As(err, &ie) {
		l.errorf(p, "%v; %s, or set allow_insecure_database: true beside it if the network to that database is trusted", ie, ie.Fix())
	}
}

var errNotURL = errors.New("not a URL")

// parseSourceURL parses a SQL source's URL as pgx does, without its
// certificate file parameters: pgx would read the files, and config check
// must work where they are absent. Errors never quote the URL.
func parseSourceURL(raw string) (*pgconn.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errNotURL
	}
	q := u.Query()
	for _, k := range []string{"sslrootcert", "sslcert", "sslkey", "sslpassword"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	cfg, err := pgconn.ParseConfig(u.String())
	if err != nil {
		return nil, errors.New("not a PostgreSQL URL")
	}
	return cfg, nil
}

func (l *loader) checkReferenceColumns(s *ReferenceSet, p path) {
	kp, vp := p.key("key"), p.key("values")
	if l.given(kp) && strings.TrimSpace(s.Key) == "" {
		l.errorf(kp, "is blank; name the column holding the codes looked up, or remove it to use the first column")
	}
	if s.Source.HTTP != nil && s.Source.HTTP.Format == FormatJSON && s.Key == "" && !l.given(kp) {
		// A JSON object has no column order, so "the first column" means
		// nothing for an array of objects; an object map needs no key.
		l.warnf(kp, "is not set: a JSON array of objects needs key: naming the field looked up (a JSON object mapping codes to values needs none)")
	}
	if l.given(vp) && len(s.Values) == 0 && !l.failed(vp) {
		l.errorf(vp, "lists no columns; list the columns to keep, e.g. values: [loinc], or remove it to keep every column but the key")
	}
	for i, v := range s.Values {
		switch {
		case strings.TrimSpace(v) == "":
			l.errorf(vp.index(i), "is blank; name a column of the source")
		case v == s.Key && s.Key != "":
			l.errorf(vp.index(i), "%q is the key column; values are the other columns, the ones a lookup returns", v)
		case slices.Index(s.Values, v) < i:
			l.errorf(vp.index(i), "%q is listed twice", v)
		}
	}
}

// checkLookup validates a lookup map edit against the reference sets.
func (l *loader) checkLookup(c *Config, op MapOp, p path) {
	l.checkMapPath(p, "from", op.From, false)
	if l.given(p.key("to")) {
		l.checkMapPath(p, "to", op.Target, true)
	} else if op.From != "" {
		// to defaults to from: the field is translated in place.
		if loc, err := parseHL7Path(op.From); err == nil {
			if why := loc.readOnly(); why != "" {
				l.errorf(p.key("from"), "%s can't be changed: %s; add a to: naming where to write the result", op.From, why)
			}
		}
	}
	sp := p.key("set")
	var names []string
	for _, s := range c.ReferenceSets {
		names = append(names, s.Name)
	}
	set := c.ReferenceSet(op.Set)
	switch {
	case !l.given(sp):
		l.errorf(sp, "is required: the reference set to look the value up in (declare it under reference_sets:)")
	case set == nil:
		l.errorf(sp, "%q is not defined (declare it under reference_sets:)%s", op.Set, didYouMean(op.Set, names, "%q"))
	case op.Column != "" && op.Column == set.Key:
		l.errorf(p.key("column"), "%q is the key column of reference set %q; name a value column", op.Column, op.Set)
	case op.Column != "" && len(set.Values) > 0 && !slices.Contains(set.Values, op.Column):
		l.errorf(p.key("column"), "%q is not one of the values of reference set %q (%s)%s",
			op.Column, op.Set, strings.Join(set.Values, ", "), didYouMean(op.Column, set.Values, "%q"))
	}
	mp := p.key("on_miss")
	misses := []OnMiss{OnMissKeep, OnMissDefault, OnMissDeadLetter}
	switch {
	case l.failed(mp):
	case !slices.Contains(misses, op.OnMiss):
		l.errorf(mp, "%q is not a miss policy (one of %s)%s", op.OnMiss, joinStrings(misses), didYouMean(string(op.OnMiss), toStrings(misses), "%s"))
	case op.OnMiss == OnMissDefault && !l.given(p.key("default")):
		l.errorf(p.key("default"), "is required with on_miss: default: the text written when the code is not in the set (e.g. default: UNMAPPED)")
	case op.OnMiss != OnMissDefault && l.given(p.key("default")):
		l.errorf(p.key("default"), "only applies to on_miss: default; remove it or set on_miss: default")
	}
}

// OnMiss says what a lookup does with a code its reference set lacks.
type OnMiss string

const (
	// OnMissKeep writes the code itself, untranslated.
	OnMissKeep OnMiss = "keep"
	// OnMissDefault writes the lookup's Default.
	OnMissDefault OnMiss = "default"
	// OnMissDeadLetter dead-letters the message, naming the set and the
	// field (not the code) in its error.
	OnMissDeadLetter OnMiss = "dead-letter"
)

func decodeLookupOp(l *loader, m map[string]*yaml.Node, p path, op *MapOp) {
	// An unmapped code passed on silently is a clinical risk, so by default
	// a miss stops the message where an operator sees it.
	op.OnMiss = OnMissDeadLetter
	am := l.mapping(m[string(MapLookup)], p, "from", "to", "set", "column", "on_miss", "default")
	decodeScalar(l, am, p, "from", &op.From, asString)
	decodeScalar(l, am, p, "to", &op.Target, asString)
	decodeScalar(l, am, p, "set", &op.Set, asString)
	decodeScalar(l, am, p, "column", &op.Column, asString)
	decodeScalar(l, am, p, "on_miss", &op.OnMiss, asString)
	decodeScalar(l, am, p, "default", &op.Value, asString)
	if !l.given(p.key("to")) {
		op.Target = op.From
	}
}
