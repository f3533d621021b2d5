package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SealedStore reports whether the store refuses content that is not
// sealed bound to its row (plaintext, or the legacy mfe1 envelope): set by
// MarkSealedStore once `mefor keys rotate` has sealed all of it. A node
// with keys then refuses such a value as tampered (crypt.Keyring.
// RefuseUnbound); until then it reads it, which is the migration step of
// turning encryption on for a store that ran without.
func SealedStore(ctx context.Context, q DBTX) (bool, error) {
	var one bool
	err := q.QueryRow(ctx, `SELECT true FROM mefor_sealed_store`).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read whether the store refuses unsealed content: %w", err)
	}
	return one, nil
}

// MarkSealedStore records that every content value is sealed row-bound,
// under key id (the active key then): from now on, unsealed content is
// refused. Marking an already marked store changes nothing.
func MarkSealedStore(ctx context.Context, q DBTX, keyID string) error {
	_, err := q.Exec(ctx, `INSERT INTO mefor_sealed_store (key_id) VALUES ($1) ON CONFLICT (only_row) DO NOTHING`, keyID)
	if err != nil {
		return fmt.Errorf("record that the store refuses unsealed content: %w", err)
	}
	return nil
}

// MarkSealedStoreIfEmpty marks the store sealed, under key id, when it
// holds no content yet (no message, transform state or reference row): a
// new store whose first node has keys never holds plaintext to accept. It
// reports whether the store is sealed now.
func MarkSealedStoreIfEmpty(ctx context.Context, q DBTX, keyID string) (bool, error) {
	tag, err := q.Exec(ctx, `
		INSERT INTO mefor_sealed_store (key_id)
		SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM mefor_message) AND NOT EXISTS (SELECT 1 FROM mefor_state)
			AND NOT EXISTS (SELECT 1 FROM mefor_reference_row)
		ON CONFLICT (only_row) DO NOTHING`, keyID)
	if err != nil {
		return false, fmt.Errorf("record that a new store refuses unsealed content: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	return SealedStore(ctx, q)
}
