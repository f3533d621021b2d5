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
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/reference"
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
	{Name: "mefor_message.raw", table: "mefor_message", column: "raw", seal: pipeline.ColRaw, kind: kindBytes, pk: idKey, pkTypes: idTypes, write: byID("mefor_message.raw")},
	{Name: "mefor_message.patient_key", table: "mefor_message", column: "patient_key", kind: kindBlind, pk: idKey, pkTypes: idTypes, write: byID("mefor_message.patient_key")},
	{Name: "mefor_work.payload", table: "mefor_work", column: "payload", seal: pipeline.ColPayload, kind: kindBytes, pk: idKey, pkTypes: idTypes, write: byID("mefor_work.payload")},
	{Name: "mefor_response.body", table: "mefor_response", column: "body", seal: pipeline.ColReply, kind: kindBytes, pk: idKey, pkTypes: idTypes, write: byID("mefor_response.body")},
	{Name: "mefor_state.value", table: "mefor_state", column: "value", seal: pipeline.ColState, kind: kindBytes,
		pk: stateKey, pkTypes: []string{"text", "text"}, write: stateValues},
	{Name: "mefor_state.key", table: "mefor_state", column: "key", kind: kindStateKey,
		pk: stateKey, pkTypes: []string{"text", "text"}},
	{Name: "mefor_reference_row.value", table: "mefor_reference_row", column: "value", seal: pipeline.ColReference, kind: kindJSON,
		pk: refKey, pkTypes: []string{"text", "bigint", "text"}, write: referenceValues},
	{Name: "mefor_message.error", table: "mefor_message", column: "error", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, write: byID("mefor_message.error")},
	{Name: "mefor_work.last_error", table: "mefor_work", column: "last_error", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, write: byID("mefor_work.last_error")},
	{Name: "mefor_event.detail", table: "mefor_event", column: "detail", seal: pipeline.ColError, kind: kindText, pk: idKey, pkTypes: idTypes, write: byID("mefor_event.detail"),
		only: "event IN ('failed', 'dead', 'replied')"},
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
		return fmt.Sprintf(`CASE WHEN substring(%[1]s FOR 5) = '\x%[2]x'::bytea THEN
			CASE WHEN length(%[1]s) > 5 THEN encode(substring(%[1]s FROM 7 FOR get_byte(%[1]s, 5)), 'escape') ELSE '?' END END`,
			v, crypt.BinaryPrefix())
	case kindText:
		p := crypt.TextPrefix()
		return fmt.Sprintf(`CASE WHEN position('%[2]s' IN %[1]s) > 0 THEN split_part(substr(%[1]s, position('%[2]s' IN %[1]s) + %[3]d), ':', 1) END`,
			v, p, len(p))
	case kindJSON:
		p := crypt.TextPrefix()
		return fmt.Sprintf(`CASE WHEN jsonb_typeof(%[1]s) = 'string' AND left(%[1]s #>> '{}', %[3]d) = '%[2]s'
			THEN split_part(substr(%[1]s #>> '{}', %[3]d + 1), ':', 1) END`, v, p, len(p))
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
	rows, err := q.Query(ctx, `SELECT column_name, key_id, n FROM mefor_key_census()`)
	if err != nil {
		return nil, fmt.Errorf("count the keys of the sealed columns: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyCount, error) {
		var k KeyCount
		err := r.Scan(&k.Column, &k.KeyID, &k.Values)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("count the keys of the sealed columns: %w", err)
	}
	return out, nil
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
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT %s, %s, coalesce(%s, '') FROM %s WHERE %s ORDER BY %s LIMIT %d FOR UPDATE SKIP LOCKED`,
		pk, value, c.keyIDSQL(), c.table, strings.Join(where, " AND "), pk, limit), args...)
	if err != nil {
		return res, fmt.Errorf("rotate %s: %w", c.Name, err)
	}
	type row struct {
		pk    []any
		value any
		raw   []byte
		from  string
	}
	var taken []row
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			return res, fmt.Errorf("rotate %s: %w", c.Name, err)
		}
		r := row{pk: vals[:len(c.pk)], value: vals[len(c.pk)], from: vals[len(vals)-1].(string)}
		if c.kind == kindBlind {
			r.raw, _ = vals[len(c.pk)+1].([]byte)
		}
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
		v, ok, err := c.reseal(kr, r.value, r.raw)
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
func (c SealedColumn) reseal(kr *crypt.Keyring, v any, raw []byte) (any, bool, error) {
	switch c.kind {
	case kindBytes:
		out, _, err := kr.Reseal(c.seal, v.([]byte))
		return out, true, err
	case kindText:
		out, _, err := kr.ResealString(c.seal, v.(string))
		return out, true, err
	case kindJSON:
		var sealed string
		if err := json.Unmarshal([]byte(v.(string)), &sealed); err != nil {
			// Legacy plaintext: the JSON object itself.
			s, _ := json.Marshal(kr.SealString(c.seal, v.(string)))
			return string(s), true, nil
		}
		plain, err := kr.OpenString(c.seal, sealed)
		if err != nil {
			return nil, false, err
		}
		s, _ := json.Marshal(kr.SealString(c.seal, plain))
		return string(s), true, nil
	default:
		stored := v.(string)
		if _, blinded := crypt.BlindKeyID(stored); !blinded {
			// Legacy plaintext: the id itself.
			return pipeline.PatientKey(kr, stored), true, nil
		}
		if raw == nil {
			return nil, false, nil
		}
		body, err := kr.Open(pipeline.ColRaw, raw)
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
