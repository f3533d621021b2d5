package ops

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/rotation"
	"github.com/mefor/mefor/migrations"
)

// KeyStatus is what `mefor keys status` shows: every sealed column's
// values by key id, and what that means for the keyring.
type KeyStatus struct {
	Counts []rotation.KeyCount `json:"counts"`
	// ByKey sums the values under each key id over every column ("" is
	// plaintext).
	ByKey map[string]int64 `json:"by_key"`
	// Active is the active key of this command's keyring ("": none).
	Active string `json:"active_key,omitempty"`
	// Pending is how many values are not under the active key: what a
	// rotation would re-seal.
	Pending int64 `json:"pending"`
	// Droppable are the ring's keys that seal nothing any more.
	Droppable []string `json:"droppable,omitempty"`
	// Unknown are key ids values are sealed under that the ring lacks.
	Unknown []string `json:"unknown,omitempty"`
	// Unbound is how many content values are not sealed bound to their
	// row (plaintext, or the legacy mfe1 envelope); SealedStore whether the
	// store refuses them (keys rotate sealed them all).
	Unbound     int64 `json:"unbound"`
	SealedStore bool  `json:"sealed_store"`
}

// KeysStatus counts the sealed values by key id. It reads every content
// row (a scan of the tables).
func KeysStatus(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring) (*KeyStatus, error) {
	var counts []rotation.KeyCount
	var unbound int64
	var sealed bool
	err := readTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if counts, err = rotation.KeyCensus(ctx, tx); err != nil {
			return err
		}
		if unbound, err = rotation.Unbound(ctx, tx); err != nil {
			return err
		}
		sealed, err = pipeline.SealedStore(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	st := &KeyStatus{Counts: counts, ByKey: map[string]int64{}, Active: kr.ActiveID(), Unbound: unbound, SealedStore: sealed}
	if st.Counts == nil {
		st.Counts = []rotation.KeyCount{}
	}
	for _, c := range counts {
		st.ByKey[c.KeyID] += c.Values
		if c.KeyID != st.Active || st.Active == "" {
			st.Pending += c.Values
		}
	}
	for _, id := range kr.IDs() {
		if id != st.Active && st.ByKey[id] == 0 {
			st.Droppable = append(st.Droppable, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(st.ByKey)) {
		if id != "" && !kr.Has(id) {
			st.Unknown = append(st.Unknown, id)
		}
	}
	return st, nil
}

// RotateOptions tunes RotateKeys.
type RotateOptions struct {
	// BatchSize is how many values one transaction re-seals. Defaults to
	// DefaultBatchSize (500) when not positive.
	BatchSize int
	// Progress, when set, is called after each batch with the values
	// re-sealed so far and how many there were to do at the start.
	Progress func(done, total int)
}

// RotateResult is what RotateKeys did.
type RotateResult struct {
	// Total is how many values were not under the active key at the start.
	Total int64 `json:"total"`
	// Resealed counts the values re-sealed, by column.
	Resealed map[string]int `json:"resealed"`
	// From counts them by the key they were under ("": plaintext).
	From map[string]int `json:"from"`
	// Left is how many values are still not under the active key: rows
	// nodes were writing while it ran (run it again), and Kept.
	Left int64 `json:"left"`
	// Kept counts patient blind indexes left under an older key because
	// retention purged the body they are made from: once that key is
	// dropped, --patient no longer finds those messages.
	Kept int `json:"kept,omitempty"`
	// SealedStore is whether the store now refuses content not sealed
	// bound to its row; Unbound how many such values are left (rows nodes
	// were writing: run it again).
	SealedStore bool  `json:"sealed_store"`
	Unbound     int64 `json:"unbound"`
}

// RotateKeys re-seals, under kr's active key, every value not under it yet:
// values under older keys and plaintext written before encryption was on.
// It works column by column in short transactions (opt.BatchSize values
// each) that skip rows a node is writing at that moment, so nodes keep
// running; each batch is audited in its transaction. An interrupted run
// keeps the batches it committed, and running it again picks up what is
// left. A batch holding a value that does not open fails before writing
// anything, naming the key.
func RotateKeys(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, opt RotateOptions) (RotateResult, error) {
	res := RotateResult{Resealed: map[string]int{}, From: map[string]int{}}
	if !kr.Enabled() {
		return res, fmt.Errorf("nothing to rotate to: %s is not set", crypt.EnvKeys)
	}
	if err := migrations.RequireRole(ctx, pool, migrations.RoleAdmin, "rotating keys"); err != nil {
		return res, err
	}
	st, err := KeysStatus(ctx, pool, kr)
	if err != nil {
		return res, err
	}
	res.Total = st.Pending
	batch := opt.BatchSize
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	done := 0
	for _, c := range rotation.SealedColumns {
		var after []any
		for {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			var b pipeline.ResealResult
			target := map[string]any{"column": c.Name, "active_key": kr.ActiveID()}
			err := withRetry(func() error {
				return audited(ctx, pool, pgx.TxOptions{}, audit.ActionKeysRotate, target, func(tx pgx.Tx) (string, error) {
					var err error
					if b, err = rotation.ResealBatch(ctx, tx, kr, c, after, batch); err != nil {
						return "", err
					}
					if b.Resealed == 0 {
						return noAudit, nil
					}
					target["values"], target["from"] = b.Resealed, b.From
					return "", nil
				})
			})
			if err != nil {
				return res, err
			}
			if b.Seen == 0 {
				break
			}
			after = b.After
			res.Resealed[c.Name] += b.Resealed
			for k, n := range b.From {
				res.From[k] += n
			}
			res.Kept += b.Kept
			done += b.Resealed
			if opt.Progress != nil {
				opt.Progress(min(done, int(res.Total)), int(res.Total))
			}
		}
	}
	after, err := KeysStatus(ctx, pool, kr)
	if err != nil {
		return res, err
	}
	res.Left = after.Pending
	if after.Unbound == 0 && !after.SealedStore {
		// Everything nodes send or transform is sealed bound to its row:
		// from now on, a value that is not was written outside mefor.
		if err := pipeline.MarkSealedStore(ctx, pool, kr.ActiveID()); err != nil {
			return res, err
		}
		after.SealedStore = true
	}
	res.SealedStore, res.Unbound = after.SealedStore, after.Unbound
	return res, nil
}

// withRetry runs fn again when PostgreSQL aborted it to break a deadlock
// with a node's transaction (a rotation batch and a hand-off touching the
// same rows in another order); a rolled-back batch changed nothing.
func withRetry(fn func() error) error {
	var err error
	for range 5 {
		if err = fn(); !rotation.IsResealConflict(err) {
			return err
		}
	}
	return err
}
