package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/maintenance"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
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

func (w *ReclaimWorker) Work(ctx context.Context, _ *river.Job[jobs.ReclaimArgs]) (err error) {
	defer func() { w.Deps.Metrics.MaintenanceRun(MaintenanceReclaim, runOutcome(err)) }()
	if _, err := RescueDeadNodes(ctx, w.Deps); err != nil {
		return err
	}
	n, err := Reclaim(ctx, w.Deps, river.ClientFromContext[pgx.Tx](ctx))
	if err != nil {
		return err
	}
	if n > 0 {
		w.Deps.Logger.InfoContext(ctx, "reclaim re-activated stranded lanes", "lanes", n)
	}
	// Reclaim runs every few seconds on one node at a time: often enough
	// to keep the summary counts about one row per key, which is what
	// `mefor status` and the gauges read.
	if _, err := pipeline.FoldCounts(ctx, w.Deps.Pool); err != nil {
		return err
	}
	return nil
}

// runOutcome is a maintenance run's outcome label.
func runOutcome(err error) string {
	if err != nil {
		return maintenance.RunFailed
	}
	return maintenance.RunOK
}

// Reclaim activates every stranded lane and returns how many it activated.
func Reclaim(ctx context.Context, d *Deps, ins jobs.Inserter) (int, error) {
	rows, err := d.Pool.Query(ctx, `
		SELECT l.name
		FROM mefor_lane l LEFT JOIN river_job j ON j.id = l.job_id
		WHERE (j.id IS NULL OR NOT (j.state::text = ANY($1::text[])))
		  AND EXISTS (SELECT 1 FROM mefor_work w WHERE w.lane = l.name AND w.status = 'pending')`, jobs.LiveStateNames())
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

// RescueDeadNodes makes the running drainers of dead nodes (leader.DeadNodes:
// left, or silent past their own node_timeout) available again at once,
// rather than after River's rescue delay, which must cover a slice plus a
// slow send. If such a node was only frozen and comes back, fencing stops
// its drainers: their execution (job id + attempted_at) is no longer the
// running one.
func RescueDeadNodes(ctx context.Context, d *Deps) (int, error) {
	dead, err := leader.DeadNodes(ctx, d.Pool)
	if err != nil || len(dead) == 0 {
		return 0, err
	}
	// Recorded the way River's own rescuer records a rescue (an error
	// entry at the rescue time, river:rescue_count), so the next execution
	// can tell it follows one that died (rescue.go).
	rows, err := d.Pool.Query(ctx, `
		UPDATE river_job j SET state = 'available', scheduled_at = clock_timestamp(),
			errors = array_append(j.errors, jsonb_build_object(
				'at', clock_timestamp(), 'attempt', j.attempt, 'trace', '',
				'error', format('rescued by mefor reclaim: node %s is dead', j.attempted_by[array_length(j.attempted_by, 1)]))),
			metadata = j.metadata || jsonb_build_object('river:rescue_count',
				coalesce(CASE WHEN jsonb_typeof(j.metadata -> 'river:rescue_count') = 'number'
					THEN (j.metadata ->> 'river:rescue_count')::int END, 0) + 1)
		WHERE j.state = 'running'
		  AND j.kind = ANY($2::text[])
		  AND j.attempted_by[array_length(j.attempted_by, 1)] = ANY($1::text[])
		RETURNING j.id, j.args->>'lane', j.attempted_by[array_length(j.attempted_by, 1)], j.queue`, dead, jobs.DrainerKinds())
	if err != nil {
		return 0, fmt.Errorf("rescue drainers of dead nodes: %w", err)
	}
	count := 0
	var queues []string
	for rows.Next() {
		var id int64
		var lane, node, queue string
		if err := rows.Scan(&id, &lane, &node, &queue); err != nil {
			return count, fmt.Errorf("rescue drainers of dead nodes: %w", err)
		}
		count++
		queues = append(queues, queue)
		d.Logger.WarnContext(ctx, "rescued drainer of a dead node", "lane", lane, "job_id", id, "dead_node", node)
	}
	if err := rows.Err(); err != nil {
		return count, err
	}
	// Made available by hand, they are announced by nobody else: the
	// producers would find them only at their poll.
	return count, jobs.NotifyQueues(ctx, d.Pool, queues)
}

// HasDeadNodeDrainers reports whether a drainer is still marked running on
// a dead node. Every node asks this each heartbeat and, when it is true,
// enqueues a reclaim at once: the periodic reclaim is scheduled by River's
// leader, and when the dead node was that leader, River takes its own
// leadership TTL (15s and more) to elect another one. It uses the same
// definition of dead as RescueDeadNodes (leader.DeadNodes): if they
// disagreed, a node would enqueue reclaims every heartbeat for drainers the
// rescue never frees.
func HasDeadNodeDrainers(ctx context.Context, db leader.DB) (bool, error) {
	dead, err := leader.DeadNodes(ctx, db)
	if err != nil || len(dead) == 0 {
		return false, err
	}
	var found bool
	err = db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT 1 FROM river_job j
			WHERE j.state = 'running'
			  AND j.kind = ANY($2::text[])
			  AND j.attempted_by[array_length(j.attempted_by, 1)] = ANY($1::text[]))`,
		dead, jobs.DrainerKinds()).Scan(&found)
	if err != nil {
		return false, fmt.Errorf("look for drainers of dead nodes: %w", err)
	}
	return found, nil
}
