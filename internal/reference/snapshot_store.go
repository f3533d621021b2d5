package reference

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mefor/mefor/internal/dbpool"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
)

// ReferenceRow is one row of a reference set: a key and its value columns,
// in the order of the snapshot's Columns.
type ReferenceRow struct {
	Key    string
	Values []string
}

// ReferenceSnapshot is the content of one version of a reference set.
type ReferenceSnapshot struct {
	// Columns names the value columns; Rows' Values follow this order.
	Columns []string
	Rows    []ReferenceRow
	// Source describes where the rows came from, without secrets.
	Source string
}

// ReferenceSetInfo is a reference set's pointer row: its live version and
// the outcome of its last syncs.
type ReferenceSetInfo struct {
	Name string `json:"name"`
	// Version is 0 while the set has no snapshot.
	Version     int64      `json:"version"`
	Columns     []string   `json:"columns"`
	Rows        int        `json:"rows"`
	SyncedAt    *time.Time `json:"synced_at,omitempty"`
	Source      string     `json:"source,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// WriteReferenceSnapshot stores snap as the new live version of set name and
// returns that version. It must run in its own transaction, which it commits
// as a whole: the rows and the pointer move together, so a reader sees the
// previous snapshot or this one, never part of it. Concurrent syncs of the
// same set serialize on the pointer row, so versions only grow. The version
// before the new one is kept, for a node that read the old pointer and is
// still loading its rows; older ones are deleted.
//
// Each row's values are sealed with kr (a code table may map patient
// identifiers); its key stays clear, the set is always loaded whole.
func WriteReferenceSnapshot(ctx context.Context, tx pgx.Tx, kr *crypt.Keyring, name string, snap ReferenceSnapshot) (int64, error) {
	if _, err := tx.Exec(ctx, dbpool.ReferenceSync.SetLocal()); err != nil {
		return 0, fmt.Errorf("write reference set %s: set timeouts: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mefor_reference_set (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name); err != nil {
		return 0, fmt.Errorf("write reference set %s: %w", name, err)
	}
	var prev int64
	if err := tx.QueryRow(ctx, `SELECT version FROM mefor_reference_set WHERE name = $1 FOR UPDATE`, name).Scan(&prev); err != nil {
		return 0, fmt.Errorf("write reference set %s: lock pointer: %w", name, err)
	}
	var version int64
	if err := tx.QueryRow(ctx, `SELECT nextval('mefor_reference_version')`).Scan(&version); err != nil {
		return 0, fmt.Errorf("write reference set %s: new version: %w", name, err)
	}
	i := 0
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"mefor_reference_row"}, []string{"set_name", "version", "key", "value"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= len(snap.Rows) {
				return nil, nil
			}
			r := snap.Rows[i]
			i++
			if len(r.Values) != len(snap.Columns) {
				return nil, fmt.Errorf("row %d has %d values for %d columns", i, len(r.Values), len(snap.Columns))
			}
			value := make(map[string]string, len(r.Values))
			for j, c := range snap.Columns {
				value[c] = r.Values[j]
			}
			return []any{name, version, r.Key, sealReferenceValue(kr, name, r.Key, value)}, nil
		}))
	if err != nil {
		return 0, fmt.Errorf("write reference set %s: rows: %w", name, err)
	}
	_, err = tx.Exec(ctx, `
		UPDATE mefor_reference_set
		SET version = $2, columns = $3, row_count = $4, synced_at = now(), source = $5,
		    last_error = NULL, last_error_at = NULL
		WHERE name = $1`, name, version, snap.Columns, n, snap.Source)
	if err != nil {
		return 0, fmt.Errorf("write reference set %s: move pointer: %w", name, err)
	}
	_, err = tx.Exec(ctx, `DELETE FROM mefor_reference_row WHERE set_name = $1 AND version <> $2 AND version <> $3`, name, version, prev)
	if err != nil {
		return 0, fmt.Errorf("write reference set %s: delete old versions: %w", name, err)
	}
	return version, nil
}

// RecordReferenceFailure notes a failed sync of set name on its pointer row,
// leaving the live snapshot as it is. msg must not hold row contents.
func RecordReferenceFailure(ctx context.Context, db pipeline.DBTX, name, msg string) error {
	_, err := db.Exec(ctx, `
		INSERT INTO mefor_reference_set (name, last_error, last_error_at) VALUES ($1, $2, now())
		ON CONFLICT (name) DO UPDATE SET last_error = excluded.last_error, last_error_at = excluded.last_error_at`,
		name, msg)
	if err != nil {
		return fmt.Errorf("record failed sync of reference set %s: %w", name, err)
	}
	return nil
}

// ReferenceVersions returns the live version of every reference set that has
// a snapshot. It is the cheap query nodes poll to notice a new snapshot.
func ReferenceVersions(ctx context.Context, db pipeline.DBTX) (map[string]int64, error) {
	rows, err := db.Query(ctx, `SELECT name, version FROM mefor_reference_set WHERE version > 0`)
	if err != nil {
		return nil, fmt.Errorf("read reference versions: %w", err)
	}
	out := make(map[string]int64)
	var name string
	var version int64
	_, err = pgx.ForEachRow(rows, []any{&name, &version}, func() error {
		out[name] = version
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read reference versions: %w", err)
	}
	return out, nil
}

// Beginner starts transactions: a pool or a connection.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// LoadReferenceSnapshot reads the live snapshot of set name: its version,
// columns and rows, all as of one moment (a repeatable-read transaction), so
// a sync committing meanwhile cannot mix two versions. Version 0 means the
// set has no snapshot; pipeline.ErrNotFound that it was never synced or attempted.
func LoadReferenceSnapshot(ctx context.Context, db Beginner, kr *crypt.Keyring, name string) (version int64, snap ReferenceSnapshot, err error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, snap, fmt.Errorf("load reference set %s: %w", name, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = tx.QueryRow(ctx, `SELECT version, columns, source FROM mefor_reference_set WHERE name = $1`, name).
		Scan(&version, &snap.Columns, &snap.Source)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, snap, fmt.Errorf("load reference set %s: %w", name, pipeline.ErrNotFound)
	}
	if err != nil {
		return 0, snap, fmt.Errorf("load reference set %s: %w", name, err)
	}
	if version == 0 {
		return 0, snap, nil
	}
	rows, err := tx.Query(ctx, `SELECT key, value FROM mefor_reference_row WHERE set_name = $1 AND version = $2 ORDER BY key`, name, version)
	if err != nil {
		return 0, snap, fmt.Errorf("load reference set %s: %w", name, err)
	}
	var key string
	var stored []byte
	_, err = pgx.ForEachRow(rows, []any{&key, &stored}, func() error {
		value, err := openReferenceValue(kr, name, key, stored)
		if err != nil {
			return fmt.Errorf("row %q: %w", key, err)
		}
		r := ReferenceRow{Key: key, Values: make([]string, len(snap.Columns))}
		for i, c := range snap.Columns {
			r.Values[i] = value[c]
		}
		snap.Rows = append(snap.Rows, r)
		return nil
	})
	if err != nil {
		return 0, snap, fmt.Errorf("load reference set %s: %w", name, err)
	}
	return version, snap, nil
}

// ReadReferenceRows reads the rows of set name's live snapshot through
// mefor_read_reference, which appends the view-reference audit row
// (recording osUser and host) in the transaction of q: an operator holds
// no SELECT on the values. Only key's row when key is not empty; at most
// limit rows when limit is positive, more saying there were others. The
// values are opened with kr and laid out in columns' order. Version 0
// means the set has no snapshot (and nothing was recorded).
func ReadReferenceRows(ctx context.Context, q pipeline.DBTX, kr *crypt.Keyring, name string, columns []string,
	key string, limit int, osUser, host string) (version int64, out []ReferenceRow, more bool, err error) {
	var keyArg *string
	if key != "" {
		keyArg = &key
	}
	rows, err := q.Query(ctx, `SELECT ref_version, row_key, row_value FROM mefor_read_reference($1, $2, $3, $4, $5)`,
		name, keyArg, limit, osUser, host)
	if err != nil {
		return 0, nil, false, fmt.Errorf("read reference set %s: %w", name, err)
	}
	var k string
	var stored []byte
	_, err = pgx.ForEachRow(rows, []any{&version, &k, &stored}, func() error {
		if limit > 0 && len(out) == limit {
			more = true
			return nil
		}
		value, err := openReferenceValue(kr, name, k, stored)
		if err != nil {
			return fmt.Errorf("row %q: %w", k, err)
		}
		r := ReferenceRow{Key: k, Values: make([]string, len(columns))}
		for i, c := range columns {
			r.Values[i] = value[c]
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return 0, nil, false, fmt.Errorf("read reference set %s: %w", name, err)
	}
	return version, out, more, nil
}

// ReferenceSets returns the pointer rows of the named sets, in the order
// given; a set never synced nor attempted has a zero row with its name.
func ReferenceSets(ctx context.Context, db pipeline.DBTX, names []string) ([]ReferenceSetInfo, error) {
	return dbpool.Rows(ctx, db, "read reference sets", func(row pgx.CollectableRow) (ReferenceSetInfo, error) {
		var s ReferenceSetInfo
		err := row.Scan(&s.Name, &s.Version, &s.Columns, &s.Rows, &s.SyncedAt, &s.Source, &s.LastError, &s.LastErrorAt)
		return s, err
	}, `
		SELECT n.name, coalesce(s.version, 0), coalesce(s.columns, '{}'), coalesce(s.row_count, 0),
		       s.synced_at, coalesce(s.source, ''), coalesce(s.last_error, ''), s.last_error_at
		FROM unnest($1::text[]) WITH ORDINALITY AS n(name, ord)
		LEFT JOIN mefor_reference_set s ON s.name = n.name
		ORDER BY n.ord`, names)
}

// sealReferenceValue is what mefor_reference_row.value holds for value:
// the JSON object itself in clear, or with kr a JSON string holding the
// object sealed (jsonb keeps the column's type either way).
func sealReferenceValue(kr *crypt.Keyring, set, key string, value map[string]string) json.RawMessage {
	obj, _ := json.Marshal(value) // a map of strings always encodes
	if !kr.Enabled() {
		return obj
	}
	s, _ := json.Marshal(kr.SealString(pipeline.ColReference, ReferenceValueRow(set, key), string(obj)))
	return s
}

// ReferenceValueRow binds a reference row's sealed value to its set and key
// (see crypt.Row); any version of the set may hold it.
func ReferenceValueRow(set, key string) crypt.Row {
	return crypt.Row("reference " + set + "\x00" + key)
}

// openReferenceValue reads the stored value of key of set back, sealed or
// clear (unless kr refuses clear values).
func openReferenceValue(kr *crypt.Keyring, set, key string, stored []byte) (map[string]string, error) {
	var sealed string
	if err := json.Unmarshal(stored, &sealed); err == nil {
		obj, err := kr.OpenString(pipeline.ColReference, ReferenceValueRow(set, key), sealed)
		if err != nil {
			return nil, err
		}
		stored = []byte(obj)
	} else if kr.RefusesUnbound() {
		return nil, &crypt.UnboundError{Column: pipeline.ColReference}
	}
	var value map[string]string
	if err := json.Unmarshal(stored, &value); err != nil {
		return nil, fmt.Errorf("not a reference row value: %w", err)
	}
	return value, nil
}

// WriteResealedReferenceValues stores re-sealed values of
// mefor_reference_row.value (JSON strings, as text) for the rows sets,
// versions and keys name, under the rows' locks the caller holds (package
// rotation re-seals them). It returns how many rows it wrote.
func WriteResealedReferenceValues(ctx context.Context, tx pgx.Tx, sets []string, versions []int64, keys, values []string) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE mefor_reference_row t SET value = u.v::jsonb
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS u(set_name, version, key, v)
		WHERE t.set_name = u.set_name AND t.version = u.version AND t.key = u.key`, sets, versions, keys, values)
	if err != nil {
		return 0, fmt.Errorf("re-seal mefor_reference_row.value: %w", err)
	}
	return tag.RowsAffected(), nil
}
