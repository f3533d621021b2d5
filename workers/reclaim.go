package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/store"
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

func (w *ReclaimWorker) Work(ctx context.Context, _ *river.Job[jobs.ReclaimArgs]) (err error) {
	defer func() { w.Deps.Metrics.MaintenanceRun(MaintenanceReclaim, runOutcome(err)) }()
	if w.Deps.NodeTimeout > 0 {
		if _, err := RescueDeadNodes(ctx, w.Deps); err != nil {
			return err
		}
	}
	n, err := Reclaim(ctx, w.Deps, river.ClientFromContext[pgx.Tx](ctx))
	if err != nil {
		return err
	}
	if n > 0 {
		w.Deps.Logger.InfoContext(ctx, "reclaim re-activated stranded lanes", "lanes", n)
	}
	return nil
}

// runOutcome is a maintenance run's outcome label.
func runOutcome(err error) string {
	if err != nil {
		return store.RunFailed
	}
	return store.RunOK
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

// deadNode is when node row n (silent past $1 seconds, or left) counts as
// dead. RescueDeadNodes and the trigger that enqueues it share it: if they
// disagreed, a node would enqueue reclaims every heartbeat for drainers the
// rescue never frees.
const deadNode = `(n.status = 'left' OR n.last_seen < clock_timestamp() - make_interval(secs => $1::float8))`

// RescueDeadNodes makes the running drainers of nodes silent for longer than
// node_timeout (or that left) available again at once, rather than after
// River's rescue delay, which must cover a slice plus a slow send. If such a
// node was only frozen and comes back, fencing stops its drainers: their
// execution (job id + attempted_at) is no longer the running one.
func RescueDeadNodes(ctx context.Context, d *Deps) (int, error) {
	rows, err := d.Pool.Query(ctx, `
		UPDATE river_job j SET state = 'available', scheduled_at = clock_timestamp()
		FROM mefor_node n
		WHERE j.state = 'running'
		  AND j.kind = ANY($2::text[])
		  AND n.id = j.attempted_by[array_length(j.attempted_by, 1)]
		  AND `+deadNode+`
		RETURNING j.id, j.args->>'lane', n.id`, d.NodeTimeout.Seconds(), jobs.DrainerKinds())
	if err != nil {
		return 0, fmt.Errorf("rescue drainers of dead nodes: %w", err)
	}
	count := 0
	for rows.Next() {
		var id int64
		var lane, node string
		if err := rows.Scan(&id, &lane, &node); err != nil {
			return count, fmt.Errorf("rescue drainers of dead nodes: %w", err)
		}
		count++
		d.Logger.WarnContext(ctx, "rescued drainer of a dead node", "lane", lane, "job_id", id, "dead_node", node)
	}
	return count, rows.Err()
}

// HasDeadNodeDrainers reports whether a drainer is still marked running on
// a node silent for longer than nodeTimeout (or that left). Every node asks
// this each heartbeat and, when it is true, enqueues a reclaim at once: the
// periodic reclaim is scheduled by River's leader, and when the dead node
// was that leader, River takes its own leadership TTL (15s and more) to
// elect another one.
func HasDeadNodeDrainers(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, nodeTimeout time.Duration) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT 1 FROM river_job j
			JOIN mefor_node n ON n.id = j.attempted_by[array_length(j.attempted_by, 1)]
			WHERE j.state = 'running'
			  AND j.kind = ANY($2::text[])
			  AND `+deadNode+`)`,
		nodeTimeout.Seconds(), jobs.DrainerKinds()).Scan(&found)
	if err != nil {
		return false, fmt.Errorf("look for drainers of dead nodes: %w", err)
	}
	return found, nil
}

// TerminateDeadNodeSessions ends the database sessions of nodes silent for
// longer than nodeTimeout, found by the application_name `mefor run` gives
// its connections (ApplicationName). A node frozen or cut off in the middle
// of a transaction keeps its session, and the lane locks it holds, for as
// long as TCP does: idle_in_transaction_session_timeout ends most of them,
// but not one stopped half-way through a pipelined batch (the server then
// waits for the rest of it, "active"). The cluster already counts such a
// node as dead and has handed its drainers on; ending its sessions frees
// its locks, and fencing keeps it from acting if it comes back.
func TerminateDeadNodeSessions(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, nodeTimeout time.Duration) ([]string, error) {
	rows, err := db.Query(ctx, `
		WITH dead AS MATERIALIZED (
			-- Materialized so the filter is complete before any session is
			-- ended: the planner may otherwise evaluate the call first.
			SELECT a.pid, n.id FROM pg_stat_activity a
			JOIN mefor_node n ON a.application_name = left($2 || n.id, 63)
			WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
			  AND n.status = 'active' AND n.last_seen < clock_timestamp() - make_interval(secs => $1::float8))
		SELECT id FROM dead WHERE pg_terminate_backend(pid)`, nodeTimeout.Seconds(), ApplicationNamePrefix)
	if err != nil {
		return nil, fmt.Errorf("end sessions of dead nodes: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ApplicationNamePrefix starts the application_name of a node's database
// sessions; the node id follows.
const ApplicationNamePrefix = "mefor "

// ApplicationName is the application_name of a node's sessions, cut to the
// 63 bytes PostgreSQL keeps.
func ApplicationName(nodeID string) string {
	name := ApplicationNamePrefix + nodeID
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}
