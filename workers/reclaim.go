package workers

import (
	"context"
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
	lanes, err := jobs.StrandedLanes(ctx, d.Pool)
	if err != nil {
		return 0, err
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
	rescued, err := jobs.RescueDeadNodeDrainers(ctx, d.Pool, dead)
	count := len(rescued)
	var queues []string
	for _, r := range rescued {
		queues = append(queues, r.Queue)
		d.Logger.WarnContext(ctx, "rescued drainer of a dead node", "lane", r.Lane, "job_id", r.ID, "dead_node", r.Node)
	}
	if err != nil {
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
	return jobs.HasDrainersOf(ctx, db, dead)
}
