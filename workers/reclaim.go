package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/jobs"
)

// ReclaimWorker re-activates lanes that have backlog but no live drainer: a
// drainer that panicked out of River's retries, was cancelled or discarded,
// or whose completion raced a crash. It runs as a River periodic job, so only
// River's elected leader enqueues it.
type ReclaimWorker struct {
	river.WorkerDefaults[jobs.ReclaimArgs]
	Deps *Deps
}

func (w *ReclaimWorker) Timeout(*river.Job[jobs.ReclaimArgs]) time.Duration { return time.Minute }

func (w *ReclaimWorker) Work(ctx context.Context, _ *river.Job[jobs.ReclaimArgs]) error {
	n, err := Reclaim(ctx, w.Deps, river.ClientFromContext[pgx.Tx](ctx))
	if err != nil {
		return err
	}
	if n > 0 {
		w.Deps.Logger.InfoContext(ctx, "reclaim re-activated stranded lanes", "lanes", n)
	}
	return nil
}

// Reclaim activates every stranded lane and returns how many it activated.
func Reclaim(ctx context.Context, d *Deps, ins jobs.Inserter) (int, error) {
	rows, err := d.Pool.Query(ctx, `
		SELECT l.name
		FROM mefor_lane l LEFT JOIN river_job j ON j.id = l.job_id
		WHERE (j.id IS NULL OR j.state NOT IN ('available', 'pending', 'running', 'retryable', 'scheduled'))
		  AND EXISTS (SELECT 1 FROM mefor_work w WHERE w.lane = l.name AND w.status = 'pending')`)
	if err != nil {
		return 0, fmt.Errorf("find stranded lanes: %w", err)
	}
	lanes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("find stranded lanes: %w", err)
	}
	for _, lane := range lanes {
		err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
			if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
				return err
			}
			return jobs.Activate(ctx, tx, ins, []string{lane})
		})
		if err != nil {
			return 0, err
		}
	}
	return len(lanes), nil
}
