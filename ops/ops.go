// Package ops holds the operator operations shared by the CLI and the admin
// HTTP endpoints: message listing and detail, dead letters, replay, bulk
// dead-letter replay, cancel and status. The SQL lives in internal/pipeline
// and internal/search; this package decides transactions, batching and lane
// wake-ups.
//
// The CLI reaches the database only through this package, and the API and
// console are to do the same. So that they need not import the packages
// that write SQL, ops names the types its operations return (aliases of
// the owning packages' types), and holds the role policy (RequiredRole)
// they explain a refusal with.
//
// Every write (replay, replay-dead, cancel, enqueue) is a call of a
// database function (pipeline.ReplayMessage and the others), which follows
// the pipeline's lock order, activates the lanes it put work into and
// appends its audit row, all in one transaction: a committed replay is
// always drained and always audited.
// Nothing here logs or returns message content.
package ops

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/dbpool"
)

// NewQueue returns an insert-only River client (no queues, no workers) for
// a process that queues jobs but does not run them, such as the CLI's
// maintenance runs. (The operator writes need none: their database
// functions activate lanes themselves.)
func NewQueue(pool *pgxpool.Pool, logger *slog.Logger) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{}
	if logger != nil {
		cfg.Logger = logger
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return client, nil
}

// readTx runs fn in a read-only repeatable-read transaction, so the several
// reads of one answer agree with each other.
func readTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// readValue is readTx for a read that returns one value, such as the
// table owners' reads, which take any dbpool.DBTX.
func readValue[T any](ctx context.Context, pool *pgxpool.Pool, read func(context.Context, dbpool.DBTX) (T, error)) (T, error) {
	var v T
	err := readTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		v, err = read(ctx, tx)
		return err
	})
	return v, err
}
