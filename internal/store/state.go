package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/state"
)

// StateRow is one stored state value, for operators and tests.
type StateRow struct {
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`
	Version   int64           `json:"version"`
	UpdatedAt time.Time       `json:"updated_at"`
	MessageID int64           `json:"message_id,omitempty"`
}

// LoadState returns the committed entries of keys, opened with kr; an
// absent key has version 0.
func LoadState(ctx context.Context, q DBTX, kr *crypt.Keyring, keys []state.Key) (map[state.Key]state.Entry, error) {
	ns, ks := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ns[i], ks[i] = k.Namespace, k.Key
	}
	rows, err := q.Query(ctx, `
		SELECT u.ns, u.k, s.value, coalesce(s.version, 0)
		FROM unnest($1::text[], $2::text[]) AS u(ns, k)
		LEFT JOIN mefor_state s ON s.namespace = u.ns AND s.key = u.k`, ns, ks)
	if err != nil {
		return nil, fmt.Errorf("load transform state: %w", err)
	}
	out := make(map[state.Key]state.Entry, len(keys))
	for rows.Next() {
		var k state.Key
		var e state.Entry
		var value []byte
		if err := rows.Scan(&k.Namespace, &k.Key, &value, &e.Version); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load transform state: %w", err)
		}
		if e.Version != 0 {
			plain, err := kr.Open(ColState, value)
			if err != nil {
				rows.Close()
				return nil, fmt.Errorf("load transform state %s: %w", k, err)
			}
			e.Value = json.RawMessage(plain)
		}
		out[k] = e
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load transform state: %w", err)
	}
	return out, nil
}

// ReadState returns the committed value of a key; ok is false when absent.
func ReadState(ctx context.Context, q DBTX, kr *crypt.Keyring, namespace, key string) (row StateRow, ok bool, err error) {
	var value []byte
	var msg *int64
	err = q.QueryRow(ctx, `
		SELECT namespace, key, value, version, updated_at, message_id
		FROM mefor_state WHERE namespace = $1 AND key = $2`, namespace, key).
		Scan(&row.Namespace, &row.Key, &value, &row.Version, &row.UpdatedAt, &msg)
	if err == pgx.ErrNoRows {
		return StateRow{}, false, nil
	}
	if err != nil {
		return StateRow{}, false, fmt.Errorf("read state of namespace %q: %w", namespace, err)
	}
	plain, err := kr.Open(ColState, value)
	if err != nil {
		return StateRow{}, false, fmt.Errorf("read state of namespace %q: %w", namespace, err)
	}
	row.Value = json.RawMessage(plain)
	if msg != nil {
		row.MessageID = *msg
	}
	return row, true, nil
}

// PurgeState deletes up to limit state values not written for keep (by the
// database clock),
// skipping any a transform hand-off is writing right now (it is being
// touched, so it is not stale). It needs no state lock: a hand-off that
// read a value purged under it finds the version gone and runs again, and
// one whose write lands after the purge simply keeps the key, as if it had
// been written before. It returns how many it deleted.
func PurgeState(ctx context.Context, q DBTX, keep time.Duration, limit int) (int, error) {
	tag, err := q.Exec(ctx, `
		WITH c AS (
			SELECT namespace, key FROM mefor_state
			WHERE updated_at < clock_timestamp() - make_interval(secs => $1::float8)
			ORDER BY updated_at
			LIMIT $2
			FOR UPDATE SKIP LOCKED
		)
		DELETE FROM mefor_state s USING c
		WHERE s.namespace = c.namespace AND s.key = c.key`,
		keep.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("purge transform state: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
