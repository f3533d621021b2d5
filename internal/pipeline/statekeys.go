package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/state"
)

// Transform state keys at rest. Scripts choose their keys, and a key is
// often a patient identifier (visits per medical record number), so with
// encryption on a key is stored as its blind index under the active key
// (mefor_state.key), with the key itself sealed beside it
// (mefor_state.key_sealed) so that a rotation can index it again under
// the next key. A key is looked up under every form it can be stored in:
// its blind index under each key of the ring, and the key itself (written
// while encryption was off). A write stores the active form and deletes the
// others, so a logical key has one row.

// ColStateKey is the sealed copy of a state key.
const ColStateKey crypt.Column = "mefor_state.key_sealed"

// StateLockClass keys the per-key advisory locks of state writes: transform
// hand-offs take them (after their lane locks, before their message locks),
// and a rotation of the keys takes them too.
const StateLockClass int32 = 0x6d73 // "ms"

// StateLockKey hashes a key into the second lock key; a collision only
// makes two keys share a lock.
func StateLockKey(k state.Key) int32 {
	h := fnv.New32a()
	h.Write([]byte(k.Namespace))
	h.Write([]byte{0})
	h.Write([]byte(k.Key))
	return int32(h.Sum32())
}

func stateKeyPurpose(namespace string) string { return "state\x00" + namespace }

// StoredStateKey is the form k's key is written in: its blind index under
// the active key, or itself with encryption off.
func StoredStateKey(kr *crypt.Keyring, k state.Key) string {
	return kr.BlindIndex(stateKeyPurpose(k.Namespace), k.Key)
}

// StateKeyForms are every form k's key may be stored in, the written one
// first.
func StateKeyForms(kr *crypt.Keyring, k state.Key) []string {
	if !kr.Enabled() {
		return []string{k.Key}
	}
	return append(kr.BlindIndexes(stateKeyPurpose(k.Namespace), k.Key), k.Key)
}

// SealStateKey is what key_sealed holds for k: nil with encryption off.
func SealStateKey(kr *crypt.Keyring, k state.Key) []byte {
	if !kr.Enabled() {
		return nil
	}
	return kr.Seal(ColStateKey, StateKeyRow(k.Namespace), []byte(k.Key))
}

// StateValueRow binds a transform state value to its key (see crypt.Row):
// the key as the script wrote it, which its blind index is made from
// again at every rotation, so the binding outlives the index.
func StateValueRow(k state.Key) crypt.Row {
	return crypt.Row("state " + k.Namespace + "\x00" + k.Key)
}

// StateKeyRow binds the sealed copy of a state key to its namespace.
func StateKeyRow(namespace string) crypt.Row { return crypt.Row("state namespace " + namespace) }

// StateLookup is the statement parts that find keys under all their forms:
// FormsSQL joins mefor_state to its arguments (namespaces, forms and the
// ordinal of the key each form belongs to) and yields, per ordinal, the
// newest row found as (ord, value, version).
type StateLookup struct {
	NS, Forms []string
	Ord       []int32
}

// LookupKeys lays out keys' forms for StateLookupSQL; the ordinal of
// keys[i] is i+1.
func LookupKeys(kr *crypt.Keyring, keys []state.Key) StateLookup {
	var l StateLookup
	for i, k := range keys {
		for _, f := range StateKeyForms(kr, k) {
			l.NS, l.Forms, l.Ord = append(l.NS, k.Namespace), append(l.Forms, f), append(l.Ord, int32(i+1))
		}
	}
	return l
}

// StateLookupSQL is a CTE "found(ord, value, version)" over arguments $a
// (namespaces), $a+1 (forms) and $a+2 (ordinals) laid out by LookupKeys.
func StateLookupSQL(a int) string {
	return fmt.Sprintf(`found AS (
		SELECT DISTINCT ON (c.ord) c.ord, s.value, s.version
		FROM unnest($%d::text[], $%d::text[], $%d::int4[]) AS c(ns, k, ord)
		JOIN mefor_state s ON s.namespace = c.ns AND s.key = c.k
		ORDER BY c.ord, s.version DESC
	)`, a, a+1, a+2)
}

// OtherStateKeyForms lists, for writing keys, the forms other than the
// written one: the rows to delete so a logical key keeps one row.
func OtherStateKeyForms(kr *crypt.Keyring, keys []state.Key) (ns, forms []string) {
	for _, k := range keys {
		all := StateKeyForms(kr, k)
		for _, f := range all[1:] {
			ns, forms = append(ns, k.Namespace), append(forms, f)
		}
	}
	return ns, forms
}

// ResealResult is what one ResealBatch did.
type ResealResult struct {
	// Seen is how many rows the batch took; 0 means the column is done
	// (but for rows other transactions held, which it skipped).
	Seen int
	// Resealed is how many values it wrote under the active key.
	Resealed int
	// From counts the values by the key they were under ("": plaintext).
	From map[string]int
	// Kept counts blind indexes left under an older key because the body
	// they were made from is gone (retention purged it).
	Kept int
	// After is the cursor for the next batch.
	After []any
}

// ResealStateKeys indexes up to limit state keys not under kr's active key
// (legacy clear keys, or blind indexes of an older key) under it, after
// the cursor, in tx. It takes the keys' state locks before touching their
// rows, as a hand-off does, so no hand-off reads or writes them meanwhile.
// A key whose sealed copy does not open fails the batch before anything is
// written.
func ResealStateKeys(ctx context.Context, tx pgx.Tx, kr *crypt.Keyring, after []any, limit int) (ResealResult, error) {
	res := ResealResult{From: map[string]int{}}
	active := crypt.BlindHeader(kr.ActiveID())
	args := []any{active}
	where := "left(key, length($1)) <> $1"
	if after != nil {
		where += " AND (namespace, key) > ($2::text, $3::text)"
		args = append(args, after...)
	}
	rows, err := tx.Query(ctx, `SELECT namespace, key, key_sealed FROM mefor_state WHERE `+where+
		fmt.Sprintf(` ORDER BY namespace, key LIMIT %d`, limit), args...)
	if err != nil {
		return res, fmt.Errorf("rotate mefor_state.key: %w", err)
	}
	type row struct {
		ns, stored string
		sealed     []byte
	}
	taken, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.ns, &x.stored, &x.sealed)
		return x, err
	})
	if err != nil {
		return res, fmt.Errorf("rotate mefor_state.key: %w", err)
	}
	res.Seen = len(taken)
	if res.Seen == 0 {
		return res, nil
	}
	res.After = []any{taken[len(taken)-1].ns, taken[len(taken)-1].stored}

	var ns, oldKeys, newKeys []string
	var sealed [][]byte
	var locks []int32
	for _, r := range taken {
		id, blinded := crypt.BlindKeyID(r.stored)
		clear := r.stored
		if blinded {
			if r.sealed == nil {
				res.Kept++ // no copy to index again from
				continue
			}
			plain, err := kr.Open(ColStateKey, StateKeyRow(r.ns), r.sealed)
			if err != nil {
				return res, fmt.Errorf("rotate mefor_state.key, namespace %q: %w", r.ns, err)
			}
			clear = string(plain)
		} else {
			id = ""
		}
		k := state.Key{Namespace: r.ns, Key: clear}
		ns, oldKeys = append(ns, r.ns), append(oldKeys, r.stored)
		newKeys, sealed = append(newKeys, StoredStateKey(kr, k)), append(sealed, SealStateKey(kr, k))
		locks = append(locks, StateLockKey(k))
		res.From[id]++
	}
	if len(ns) == 0 {
		return res, nil
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) WITH ORDINALITY AS u(k, n) ORDER BY n`,
		StateLockClass, locks); err != nil {
		return res, fmt.Errorf("rotate mefor_state.key: lock keys: %w", err)
	}
	// A key a hand-off rewrote before the locks was written under the
	// active form, its old row deleted: it updates nothing here.
	tag, err := tx.Exec(ctx, `
		UPDATE mefor_state s SET key = u.nk, key_sealed = u.ks
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) AS u(ns, ok, nk, ks)
		WHERE s.namespace = u.ns AND s.key = u.ok`, ns, oldKeys, newKeys, sealed)
	if err != nil {
		return res, fmt.Errorf("rotate mefor_state.key: %w", err)
	}
	res.Resealed = int(tag.RowsAffected())
	return res, nil
}

// decodeStateValue opens the stored value of k.
func decodeStateValue(kr *crypt.Keyring, k state.Key, value []byte) (json.RawMessage, error) {
	plain, err := kr.Open(ColState, StateValueRow(k), value)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(plain), nil
}
