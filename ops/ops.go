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
// Every write follows the pipeline's lock order (lane locks, then message
// finalize locks) inside one transaction, and activates the lanes it put work
// into in that same transaction, so a committed replay is always drained.
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
	"github.com/riverqueue/river/rivertype"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/jobs"
)

// Queue is what the writes need of a River client: inserting lane drainers
// (jobs.Activate) and making a snoozed drainer available at once. Both a
// node's client and an insert-only one (NewQueue) satisfy it.
type Queue interface {
	jobs.Inserter
	JobRetryTx(ctx context.Context, tx pgx.Tx, id int64) (*rivertype.JobRow, error)
}

// NewQueue returns an insert-only River client (no queues, no workers) for
// a process that re-queues work but does not run it, such as the CLI.
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

// wake makes the snoozed drainers of lanes available now. It is called after
// an operator cut a head's backoff short (replay of a waiting row) or
// removed a head (cancel): the lane can move at once instead of when the
// drainer's snooze ends. A drainer woken for nothing finds its head still
// waiting and snoozes again. The job rows are locked (ScheduledDrainers), so
// none of them can be running or finished when it is made available.
func wake(ctx context.Context, tx pgx.Tx, q Queue, lanes []string) error {
	ids, err := jobs.ScheduledDrainers(ctx, tx, lanes)
	if err != nil {
		return err
	}
	var queues []string
	for _, id := range ids {
		job, err := q.JobRetryTx(ctx, tx, id)
		if err != nil {
			return fmt.Errorf("wake drainer job %d: %w", id, err)
		}
		queues = append(queues, job.Queue)
	}
	// River does not announce a retried job; its producers would find it
	// only at their poll.
	return jobs.NotifyQueues(ctx, tx, queues)
}
