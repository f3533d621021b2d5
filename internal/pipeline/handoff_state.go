package pipeline

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/state"
)

// Transform state in the hand-off (see package state for the model).
//
// A transform hand-off whose rows read or wrote state queues, after its
// lane locks and its consume:
//
//  1. the keys' advisory locks, sorted, so two hand-offs over the same keys
//     serialize and cannot deadlock (only transform hand-offs take them,
//     always after their lane locks and before their message locks);
//  2. the check: every version read is still the committed one;
//  3. a check that every row whose writes are applied was consumed by this
//     hand-off (a row dead-lettered or cancelled under it must not leave
//     its writes behind);
//  4. the writes: the batch's last value per key, each with a fresh
//     version.
//
// When a check fails, TransformBatch returns a *StateConflict and the
// caller's transaction rolls back with everything queued.

// StateConflict means a transform read state that another hand-off changed
// before this one committed, or a row of the batch was no longer pending.
// Nothing was written. Current holds the committed entries of the keys
// whose versions differed, to refresh the cache with before running the
// batch again.
type StateConflict struct {
	Current map[state.Key]state.Entry
	// RowsChanged is set when a row of the batch was no longer pending.
	RowsChanged bool
}

func (e *StateConflict) Error() string {
	if e.RowsChanged {
		return "transform state not written: a row of the batch changed under the hand-off"
	}
	return fmt.Sprintf("transform state changed under the batch (%d keys); run it again", len(e.Current))
}

// TamperedStateError means a transform read a state value that does not
// open as sealed for its key: altered, copied from another key, or
// plaintext in a sealed store. It must never feed a transform. Key is for
// the caller to find the rows that read it; the message names only the
// namespace, since keys are often patient identifiers.
type TamperedStateError struct {
	Key state.Key
	Err error
}

func (e *TamperedStateError) Error() string {
	return fmt.Sprintf("transform state in namespace %q: %v", e.Key.Namespace, e.Err)
}

func (e *TamperedStateError) Unwrap() error { return e.Err }

// stateOpenError is the error of a state value of k that did not open: a
// *TamperedStateError when it must never be used, else (a missing key) an
// error naming the namespace only.
func stateOpenError(k state.Key, err error) error {
	if crypt.IsTampered(err) {
		return &TamperedStateError{Key: k, Err: err}
	}
	return fmt.Errorf("transform state in namespace %q: %w", k.Namespace, err)
}

// stateHandoff is the state part of one transform hand-off.
type stateHandoff struct {
	conflict *StateConflict
	// writes is the last write of each key, and where to report its
	// committed version.
	writes map[state.Key]*state.Write
	order  []state.Key
	// committed is filled by the write statement.
	committed map[state.Key]int64
	notDone   int
}

// queueState queues the state statements of a transform hand-off onto h.
// It does nothing when no row touched state. Call it after the lane locks
// and the consume update are queued.
func queueState(h *handoff, rows []Row, decisions []TransformDecision) {
	s := &stateHandoff{writes: map[state.Key]*state.Write{}, committed: map[state.Key]int64{}}
	reads := map[state.Key]int64{}
	var readOrder []state.Key
	var writers []int64 // rows whose writes are applied
	for i, d := range decisions {
		c := d.State
		if c.Empty() {
			continue
		}
		for _, r := range c.Reads {
			if _, ok := reads[r.Key]; !ok {
				reads[r.Key] = r.Version
				readOrder = append(readOrder, r.Key)
			}
		}
		if d.DeadReason != "" || len(c.Writes) == 0 {
			continue
		}
		writers = append(writers, rows[i].ID)
		for j := range c.Writes {
			w := &c.Writes[j]
			if prev, ok := s.writes[w.Key]; ok {
				prev.Version = state.Superseded
			} else {
				s.order = append(s.order, w.Key)
			}
			s.writes[w.Key] = w
		}
	}
	if len(readOrder) == 0 && len(s.order) == 0 {
		return
	}

	// 1. Locks, on every key read or written.
	locks := make([]int32, 0, len(readOrder)+len(s.order))
	for _, k := range readOrder {
		locks = append(locks, StateLockKey(k))
	}
	for _, k := range s.order {
		locks = append(locks, StateLockKey(k))
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	h.b.Queue(`SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) WITH ORDINALITY AS u(k, n) ORDER BY n`,
		StateLockClass, locks)

	// 2. Every version read is still the committed one, each key looked
	// up under every form it may be stored in (StateKeyForms).
	if len(readOrder) > 0 {
		vers := make([]int64, len(readOrder))
		for i, k := range readOrder {
			vers[i] = reads[k]
		}
		l := LookupKeys(h.keys, readOrder)
		h.b.Queue(`
			WITH `+StateLookupSQL(1)+`
			SELECT r.ord, f.value, coalesce(f.version, 0)
			FROM unnest($4::bigint[]) WITH ORDINALITY AS r(v, ord)
			LEFT JOIN found f ON f.ord = r.ord
			WHERE coalesce(f.version, 0) <> r.v`, l.NS, l.Forms, l.Ord, vers).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var ord int64
				var e state.Entry
				var value []byte
				if err := rows.Scan(&ord, &value, &e.Version); err != nil {
					return err
				}
				k := readOrder[ord-1]
				if e.Version != 0 {
					plain, err := h.keys.Open(ColState, StateValueRow(k), value)
					if err != nil {
						return stateOpenError(k, err)
					}
					e.Value = json.RawMessage(plain)
				}
				if s.conflict == nil {
					s.conflict = &StateConflict{Current: map[state.Key]state.Entry{}}
				}
				s.conflict.Current[k] = e
			}
			return rows.Err()
		})
	}
	if len(s.order) == 0 {
		h.checks = append(h.checks, s.check)
		return
	}

	// 3. Every row whose writes are applied was consumed here.
	h.b.Queue(`SELECT count(*) FROM mefor_work WHERE id = ANY($1::bigint[]) AND status <> 'done'`, writers).
		QueryRow(func(r pgx.Row) error { return r.Scan(&s.notDone) })

	// 4. The writes.
	var setNS, setKey, delNS, delKey []string
	var setValue, setSealed [][]byte
	var setMsg []int64
	var setKeys []state.Key
	msgOf := map[state.Key]int64{}
	for i, d := range decisions {
		if d.DeadReason != "" || d.State.Empty() {
			continue
		}
		for _, w := range d.State.Writes {
			msgOf[w.Key] = rows[i].MessageID
		}
	}
	// A write stores the key's active form and deletes its other forms; a
	// delete deletes them all.
	stored := map[state.Key]string{}
	for _, k := range s.order {
		w := s.writes[k]
		forms := StateKeyForms(h.keys, k)
		if w.Value == nil {
			for _, f := range forms {
				delNS, delKey = append(delNS, k.Namespace), append(delKey, f)
			}
			continue
		}
		for _, f := range forms[1:] {
			delNS, delKey = append(delNS, k.Namespace), append(delKey, f)
		}
		stored[k] = forms[0]
		setKeys = append(setKeys, k)
		setNS, setKey = append(setNS, k.Namespace), append(setKey, forms[0])
		setSealed = append(setSealed, SealStateKey(h.keys, k))
		setValue, setMsg = append(setValue, h.keys.Seal(ColState, StateValueRow(k), []byte(w.Value))), append(setMsg, msgOf[k])
	}
	if len(delNS) > 0 {
		h.b.Queue(`
			DELETE FROM mefor_state s USING unnest($1::text[], $2::text[]) AS u(ns, k)
			WHERE s.namespace = u.ns AND s.key = u.k`, delNS, delKey)
	}
	if len(setNS) > 0 {
		h.b.Queue(`
			INSERT INTO mefor_state (namespace, key, value, version, updated_at, message_id, key_sealed)
			SELECT ns, k, v, nextval('mefor_state_version'), clock_timestamp(), m, ks
			FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[], $5::bytea[]) WITH ORDINALITY AS u(ns, k, v, m, ks, n)
			ORDER BY n
			ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version,
				updated_at = EXCLUDED.updated_at, message_id = EXCLUDED.message_id, key_sealed = EXCLUDED.key_sealed
			RETURNING namespace, key, version`, setNS, setKey, setValue, setMsg, setSealed).Query(func(rows pgx.Rows) error {
			byStored := make(map[state.Key]state.Key, len(setKeys))
			for _, k := range setKeys {
				byStored[state.Key{Namespace: k.Namespace, Key: stored[k]}] = k
			}
			for rows.Next() {
				var k state.Key
				var v int64
				if err := rows.Scan(&k.Namespace, &k.Key, &v); err != nil {
					return err
				}
				s.committed[byStored[k]] = v
			}
			return rows.Err()
		})
	}
	h.checks = append(h.checks, s.check)
}

// check runs once the batch has: it reports a conflict, or records the
// committed versions on the writes.
func (s *stateHandoff) check() error {
	if s.conflict != nil {
		return s.conflict
	}
	if s.notDone > 0 {
		return &StateConflict{RowsChanged: true}
	}
	for _, k := range s.order {
		w := s.writes[k]
		if w.Value == nil {
			w.Version = 0
			continue
		}
		v, ok := s.committed[k]
		if !ok {
			return fmt.Errorf("transform state: the write of %s returned no version", k)
		}
		w.Version = v
	}
	return nil
}
