package pipeline

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
// absent key has version 0. Each key is looked up under every form it may
// be stored in (see statekeys.go).
func LoadState(ctx context.Context, q DBTX, kr *crypt.Keyring, keys []state.Key) (map[state.Key]state.Entry, error) {
	out := make(map[state.Key]state.Entry, len(keys))
	for _, k := range keys {
		out[k] = state.Entry{}
	}
	l := LookupKeys(kr, keys)
	rows, err := q.Query(ctx, `WITH `+StateLookupSQL(1)+` SELECT ord, value, version FROM found`, l.NS, l.Forms, l.Ord)
	if err != nil {
		return nil, fmt.Errorf("load transform state: %w", err)
	}
	for rows.Next() {
		var ord int32
		var value []byte
		var e state.Entry
		if err := rows.Scan(&ord, &value, &e.Version); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load transform state: %w", err)
		}
		k := keys[ord-1]
		if e.Value, err = decodeStateValue(kr, k, value); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load transform state: %w", stateOpenError(k, err))
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
	forms := StateKeyForms(kr, state.Key{Namespace: namespace, Key: key})
	err = q.QueryRow(ctx, `
		SELECT namespace, value, version, updated_at, message_id
		FROM mefor_state WHERE namespace = $1 AND key = ANY($2)
		ORDER BY version DESC LIMIT 1`, namespace, forms).
		Scan(&row.Namespace, &value, &row.Version, &row.UpdatedAt, &msg)
	if err == pgx.ErrNoRows {
		return StateRow{}, false, nil
	}
	if err != nil {
		return StateRow{}, false, fmt.Errorf("read state of namespace %q: %w", namespace, err)
	}
	row.Key = key
	if row.Value, err = decodeStateValue(kr, state.Key{Namespace: namespace, Key: key}, value); err != nil {
		return StateRow{}, false, fmt.Errorf("read state of namespace %q: %w", namespace, err)
	}
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
