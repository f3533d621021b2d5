// Package rotation re-seals stored content under the keyring's active key
// and counts the values under each key: the list of sealed columns, the key
// census and one batch of a rotation. The statements that write the
// re-sealed values are their tables' owners' (pipeline.WriteResealed,
// pipeline.ResealStateKeys, reference.WriteResealedReferenceValues).
package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/internal/state"
)

// SealedColumn is one column that holds sealed values (or legacy plaintext
// ones, written while encryption was off), for key rotation and the key
// census.
type SealedColumn struct {
	// Name is table.column, as `mefor keys status` prints it.
	Name   string
	table  string
	column string
	seal   crypt.Column
	kind   sealKind
	// pk are the primary key columns and their types: the rotation's
	// cursor.
	pk, pkTypes []string
	// only narrows the rows: of the event details, only those of failed and
	// dead events quote errors; the others are metadata (a route name).
	only string
	// bind are the SQL expressions read with each value to name its row
	// (crypt.Row), and row makes the row of them.
	bind string
	row  func(kr *crypt.Keyring, ns any, vals []any) (crypt.Row, error)
	// write stores the re-sealed values of the rows pks names (one slice
	// per primary key column, typed as pkTypes say) in the table's owner.
	write func(ctx context.Context, tx pgx.Tx, pks []any, values any) (int64, error)
}

type sealKind int

const (
	kindBytes sealKind = iota
	kindText
	kindJSON     // jsonb holding a JSON string when sealed
	kindBlind    // a blind index, made again from the message body
	kindStateKey // a state key's blind index, made again from its sealed copy
)

var (
	idKey    = []string{"id"}
	idTypes  = []string{"bigint"}
	stateKey = []string{"namespace", "key"}
	refKey   = []string{"set_name", "version", "key"}
)

// SealedColumns lists every column rotation re-seals, in the order it does
// them. A column added to hold content must be added here (and to
// migrations' contentColumns).
var SealedColumns = []SealedColumn{
	{Name: "mefor_message.raw", table: "mefor_message", column: "raw", seal: pipeline.ColRaw, kind: kindBytes, pk: idKey, pkTypes: idTypes, bind: "id", row: ofMessage, write: byID("mefor_message.raw")},
	{Name: "mefor_message.patient_key", table: "mefor_message", column: "patient_key", kind: kindBlind, pk: idKey, pkTypes: idTypes, bind: "id", row: ofMessage, write: byID("mefor_message.patient_key")},
	{Name: "mefor_work.payload", table: "mefor_work", column: "payload", seal: pipeline.ColPayload, kind: kindBytes, pk: idKey, pkTypes: idTypes, bind: "message_id", row: ofMessage, write: byID("mefor_work.payload")},
	{Name: "mefor_response.body", table: "mefor_response", column: "body", seal: pipeline.ColReply, kind: kindBytes, pk: idKey, pkTypes: idTypes, bind: "message_id", row: ofMessage, write: byID("mefor_response.body")},
	{Name: "mefor_state.value", table: "mefor_state", column: "value", seal: pipeline.ColState, kind: kindBytes,
		pk: stateKey, pkTypes: []string{"text", "text"}, bind: "key, key_sealed", row: ofState, write: stateValues},
	{Name: "mefor_state.key", table: "mefor_state", column: "key", kind: kindStateKey,
		pk: stateKey, pkTypes: []string{"text", "text"}},
	{Name: "mefor_reference_row.value", table: "mefor_reference_row", column: "value", seal: pipeline.ColReference, kind: kindJSON,
		pk: refKey, pkTypes: []string{"text", "bigint", "text"}, bind: "set_name, key", row: ofReference, write: referenceValues},
	{Name: "mefor_message.error", table: "mefor_message", column: "error", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, bind: "id", row: ofMessage, write: byID("mefor_message.error")},
	{Name: "mefor_work.last_error", table: "mefor_work", column: "last_error", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, bind: "message_id", row: ofMessage, write: byID("mefor_work.last_error")},
	{Name: "mefor_event.detail", table: "mefor_event", column: "detail", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, bind: "message_id", row: ofMessage, write: byID("mefor_event.detail"),
		only: "event IN ('failed', 'dead', 'replied')"},
}

// ofMessage is the row of a value bound to its message (pipeline.MessageRow).
func ofMessage(_ *crypt.Keyring, _ any, vals []any) (crypt.Row, error) {
	return pipeline.MessageRow(vals[0].(int64)), nil
}

// ofState is the row of a transform state value: its key as the script
// wrote it, read from its sealed copy when the stored key is a blind index.
func ofState(kr *crypt.Keyring, ns any, vals []any) (crypt.Row, error) {
	stored := vals[0].(string)
	if _, blinded := crypt.BlindKeyID(stored); !blinded {
		return pipeline.StateValueRow(state.Key{Namespace: ns.(string), Key: stored}), nil
	}
	sealed, _ := vals[1].([]byte)
	plain, err := kr.Open(pipeline.ColStateKey, pipeline.StateKeyRow(ns.(string)), sealed)
	if err != nil {
		return "", err
	}
	return pipeline.StateValueRow(state.Key{Namespace: ns.(string), Key: string(plain)}), nil
}

// ofReference is the row of a reference value: its set and key.
func ofReference(_ *crypt.Keyring, _ any, vals []any) (crypt.Row, error) {
	return reference.ReferenceValueRow(vals[0].(string), vals[1].(string)), nil
}

// byID writes the values of an id-keyed column of the pipeline's tables.
func byID(column string) func(context.Context, pgx.Tx, []any, any) (int64, error) {
	return func(ctx context.Context, tx pgx.Tx, pks []any, values any) (int64, error) {
		return pipeline.WriteResealed(ctx, tx, column, pks[0].([]int64), values)
	}
}

// stateValues writes the values of mefor_state.value.
func stateValues(ctx context.Context, tx pgx.Tx, pks []any, values any) (int64, error) {
	return pipeline.WriteResealedState(ctx, tx, pks[0].([]string), pks[1].([]string), values.([][]byte))
}

// referenceValues writes the values of mefor_reference_row.value.
func referenceValues(ctx context.Context, tx pgx.Tx, pks []any, values any) (int64, error) {
	return reference.WriteResealedReferenceValues(ctx, tx, pks[0].([]string), pks[1].([]int64), pks[2].([]string), values.([]string))
}

// keyIDSQL is the SQL expression of the key id a value of c is sealed
// under: NULL for plaintext, '?' for a damaged envelope.
func (c SealedColumn) keyIDSQL() string {
	v := c.column
	switch c.kind {
	case kindBytes:
		return fmt.Sprintf(`CASE WHEN substring(%[1]s FOR 4) = '\x%[2]x'::bytea THEN
			CASE WHEN length(%[1]s) > 5 THEN encode(substring(%[1]s FROM 7 FOR get_byte(%[1]s, 5)), 'escape') ELSE '?' END END`,
			v, crypt.BinaryPrefix())
	case kindText:
		return fmt.Sprintf(`substring(%s FROM '%s')`, v, crypt.TextPattern())
	case kindJSON:
		return fmt.Sprintf(`CASE WHEN jsonb_typeof(%[1]s) = 'string' THEN substring(%[1]s #>> '{}' FROM '^%[2]s') END`, v, crypt.TextPattern())
	default: // the blind indexes
		p := crypt.BlindPrefix()
		return fmt.Sprintf(`CASE WHEN left(%[1]s, %[3]d) = '%[2]s' THEN split_part(substr(%[1]s, %[3]d + 1), ':', 1) END`, v, p, len(p))
	}
}

// present is the SQL condition of rows that hold a value in c.
func (c SealedColumn) present() string {
	cond := c.column + " IS NOT NULL"
	if c.kind == kindText || c.kind == kindBlind || c.kind == kindStateKey {
		cond += " AND " + c.column + " <> ''"
	}
	if c.only != "" {
		cond += " AND " + c.only
	}
	return cond
}

// KeyCount is how many values of a column are held under one key id ("":
// plaintext).
type KeyCount struct {
	Column string `json:"column"`
	KeyID  string `json:"key_id,omitempty"`
	Values int64  `json:"values"`
}

// KeyCensus counts the values of every sealed column by key id, through
// mefor_key_census (migration 022), which returns only the counts: an
// operator, who runs `keys status`, may not read the payload and reply
// columns. It reads every row that holds content, so it costs a scan of
// the tables.
func KeyCensus(ctx context.Context, q pipeline.DBTX) ([]KeyCount, error) {
	return dbpool.Rows(ctx, q, "count the keys of the sealed columns", func(r pgx.CollectableRow) (KeyCount, error) {
		var k KeyCount
		err := r.Scan(&k.Column, &k.KeyID, &k.Values)
		return k, err
	}, `SELECT column_name, key_id, n FROM mefor_key_census()`)
}

// KeyCensusDirect is KeyCensus reading the tables itself (an admin's
// reads), from SealedColumns: mefor_key_census must give the same counts
// (the key rotation test compares them).
func KeyCensusDirect(ctx context.Context, q pipeline.DBTX) ([]KeyCount, error) {
	var out []KeyCount
	for _, c := range SealedColumns {
		rows, err := q.Query(ctx, fmt.Sprintf(`SELECT coalesce(%s, ''), count(*) FROM %s WHERE %s GROUP BY 1 ORDER BY 1`,
			c.keyIDSQL(), c.table, c.present()))
		if err != nil {
			return nil, fmt.Errorf("count the keys of %s: %w", c.Name, err)
		}
		counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyCount, error) {
			k := KeyCount{Column: c.Name}
			err := r.Scan(&k.KeyID, &k.Values)
			return k, err
		})
		if err != nil {
			return nil, fmt.Errorf("count the keys of %s: %w", c.Name, err)
		}
		out = append(out, counts...)
	}
	return out, nil
}

// refusedColumns are the columns whose values a sealed store
// (pipeline.SealedStore) refuses when they are not sealed row-bound: the
// content nodes send or transform. Error and event texts are also written
// in clear by SQL and are only ever shown, so they are not refused.
var refusedColumns = []string{"mefor_message.raw", "mefor_work.payload", "mefor_response.body", "mefor_state.value", "mefor_reference_row.value"}

// Unbound counts the values of the refused columns that are not sealed
// bound to their row (plaintext, or the legacy mfe1 envelope): once it is
// zero, keys rotate marks the store sealed. It reads every content row,
// through mefor_unbound_count (migration 022), which returns the count
// only: operators, who run keys status, may not SELECT content.
func Unbound(ctx context.Context, q pipeline.DBTX) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT mefor_unbound_count()`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the unsealed content values: %w", err)
	}
	return n, nil
}

// UnboundDirect is Unbound reading the tables itself (an admin's reads),
// from SealedColumns and refusedColumns: mefor_unbound_count must give the
// same count (the key rotation test of cmd/mefor compares them).
func UnboundDirect(ctx context.Context, q pipeline.DBTX) (int64, error) {
	var total int64
	for _, c := range SealedColumns {
		if !slices.Contains(refusedColumns, c.Name) {
			continue
		}
		var cond string
		switch c.kind {
		case kindBytes:
			m := crypt.BinaryMagic()
			cond = fmt.Sprintf(`substring(%s FOR %d) <> '\x%x'::bytea`, c.column, len(m), m)
		case kindJSON:
			m := crypt.TextMagic()
			cond = fmt.Sprintf(`NOT (jsonb_typeof(%[1]s) = 'string' AND left(%[1]s #>> '{}', %[2]d) = '%[3]s')`, c.column, len(m), m)
		}
		var n int64
		if err := q.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s AND %s`, c.table, c.present(), cond)).Scan(&n); err != nil {
			return 0, fmt.Errorf("count the unsealed values of %s: %w", c.Name, err)
		}
		total += n
	}
	return total, nil
}

// IsResealConflict reports whether err is PostgreSQL aborting a
// ResealBatch to break a deadlock (40P01) or a serialization failure
// (40001) with a node's transaction touching the same rows in another
// order. The batch's transaction rolled back and changed nothing, so it is
// safe to run again.
func IsResealConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// ResealBatch re-seals under kr's active key up to limit values of c that
// are not under it yet (plaintext, or another key), after the cursor
// (nil: from the start), in tx. It locks the rows it takes and skips rows
// another transaction holds (a node writing them): those are left for the
// next run. Every value is opened before anything is written, so a value
// that does not open (its key is missing) fails the batch whole, naming
// the key and the column.
func ResealBatch(ctx context.Context, tx pgx.Tx, kr *crypt.Keyring, c SealedColumn, after []any, limit int) (pipeline.ResealResult, error) {
	res := pipeline.ResealResult{From: map[string]int{}}
	if !kr.Enabled() {
		return res, fmt.Errorf("rotate %s: no keys: set %s", c.Name, crypt.EnvKeys)
	}
	if c.kind == kindStateKey {
		return pipeline.ResealStateKeys(ctx, tx, kr, after, limit)
	}
	pk := strings.Join(c.pk, ", ")
	where := []string{c.present(), c.pending(kr.ActiveID())}
	args := []any{}
	if after != nil {
		ph := make([]string, len(after))
		for i := range after {
			ph[i] = fmt.Sprintf("$%d::%s", i+1, c.pkTypes[i])
		}
		where = append(where, fmt.Sprintf("(%s) > (%s)", pk, strings.Join(ph, ", ")))
		args = append(args, after...)
	}
	value := c.column
	switch c.kind {
	case kindJSON:
		value = c.column + "::text"
	case kindBlind:
		value = c.column + ", raw"
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT %s, %s, %s, coalesce(%s, '') FROM %s WHERE %s ORDER BY %s LIMIT %d FOR UPDATE SKIP LOCKED`,
		pk, value, c.bind, c.keyIDSQL(), c.table, strings.Join(where, " AND "), pk, limit), args...)
	if err != nil {
		return res, fmt.Errorf("rotate %s: %w", c.Name, err)
	}
	type row struct {
		pk    []any
		value any
		raw   []byte
		from  string
		bind  []any
	}
	var taken []row
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			return res, fmt.Errorf("rotate %s: %w", c.Name, err)
		}
		r := row{pk: vals[:len(c.pk)], value: vals[len(c.pk)], from: vals[len(vals)-1].(string)}
		bound := len(c.pk) + 1
		if c.kind == kindBlind {
			r.raw, _ = vals[len(c.pk)+1].([]byte)
			bound++
		}
		r.bind = vals[bound : len(vals)-1]
		taken = append(taken, r)
	}
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("rotate %s: %w", c.Name, err)
	}
	res.Seen = len(taken)
	if res.Seen == 0 {
		return res, nil
	}
	res.After = taken[len(taken)-1].pk

	// Everything opened first: nothing is written unless all of it opens.
	pks := make([][]any, len(c.pk))
	var values []any
	for _, r := range taken {
		at, err := c.row(kr, r.pk[0], r.bind)
		if err != nil {
			return res, fmt.Errorf("rotate %s, row %v: %w", c.Name, r.pk, err)
		}
		v, ok, err := c.reseal(kr, at, r.value, r.raw)
		if err != nil {
			return res, fmt.Errorf("rotate %s, row %v: %w", c.Name, r.pk, err)
		}
		if !ok {
			res.Kept++
			continue
		}
		for i := range c.pk {
			pks[i] = append(pks[i], r.pk[i])
		}
		values = append(values, v)
		res.From[r.from]++
	}
	if len(values) == 0 {
		return res, nil
	}
	vType := map[sealKind]string{kindBytes: "bytea", kindText: "text", kindJSON: "text", kindBlind: "text"}[c.kind]
	keys := make([]any, len(c.pk))
	for i := range c.pk {
		keys[i] = typed(pks[i], c.pkTypes[i])
	}
	n, err := c.write(ctx, tx, keys, typed(values, vType))
	if err != nil {
		return res, fmt.Errorf("rotate %s: %w", c.Name, err)
	}
	res.Resealed = int(n)
	return res, nil
}

// pending is the SQL condition of values of c not under key id active.
func (c SealedColumn) pending(active string) string {
	switch c.kind {
	case kindBytes:
		h := crypt.BinaryHeader(active)
		return fmt.Sprintf(`substring(%s FOR %d) <> '\x%x'::bytea`, c.column, len(h), h)
	case kindText:
		return fmt.Sprintf(`position('%s' IN %s) = 0`, crypt.TextHeader(active), c.column)
	case kindJSON:
		h := crypt.TextHeader(active)
		return fmt.Sprintf(`NOT (jsonb_typeof(%[1]s) = 'string' AND left(%[1]s #>> '{}', %[2]d) = '%[3]s')`, c.column, len(h), h)
	default:
		h := crypt.BlindHeader(active)
		return fmt.Sprintf(`left(%s, %d) <> '%s'`, c.column, len(h), h)
	}
}

// reseal is the value of c under the active key; ok is false for a blind
// index that cannot be made again (no body left to read the id from).
func (c SealedColumn) reseal(kr *crypt.Keyring, at crypt.Row, v any, raw []byte) (any, bool, error) {
	switch c.kind {
	case kindBytes:
		out, _, err := kr.Reseal(c.seal, at, v.([]byte))
		return out, true, err
	case kindText:
		out, _, err := kr.ResealString(c.seal, at, v.(string))
		return out, true, err
	case kindJSON:
		var sealed string
		if err := json.Unmarshal([]byte(v.(string)), &sealed); err != nil {
			// Legacy plaintext: the JSON object itself.
			s, _ := json.Marshal(kr.SealString(c.seal, at, v.(string)))
			return string(s), true, nil
		}
		out, _, err := kr.ResealString(c.seal, at, sealed)
		if err != nil {
			return nil, false, err
		}
		s, _ := json.Marshal(out)
		return string(s), true, nil
	default:
		stored := v.(string)
		if _, blinded := crypt.BlindKeyID(stored); !blinded && stored != pipeline.UnindexedPatient {
			// Legacy plaintext: the id itself.
			return pipeline.PatientKey(kr, stored), true, nil
		}
		if raw == nil {
			return nil, false, nil
		}
		body, err := kr.Open(pipeline.ColRaw, at, raw)
		if err != nil {
			return nil, false, err
		}
		msg, err := hl7.Parse(body)
		if err != nil {
			return nil, false, nil
		}
		id := msg.Get("PID-3.1")
		if id == "" {
			return nil, false, nil
		}
		return pipeline.PatientKey(kr, id), true, nil
	}
}

// typed turns values into a slice of the Go type pgx encodes as an array
// of typ.
func typed(vs []any, typ string) any {
	switch typ {
	case "bigint":
		out := make([]int64, len(vs))
		for i, v := range vs {
			out[i] = v.(int64)
		}
		return out
	case "bytea":
		out := make([][]byte, len(vs))
		for i, v := range vs {
			out[i] = v.([]byte)
		}
		return out
	default:
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = v.(string)
		}
		return out
	}
}
