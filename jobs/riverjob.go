package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// Every statement of mefor's on River's river_job table, and on the lane
// registry (mefor_lane) beyond lane.go's, is here: mefor reads River's jobs
// to fence its drainers, to find and rescue the drainers of dead nodes and
// to report on maintenance jobs, and changes them only where River has no
// call for it (RescueDeadNodeDrainers).

// DB is what the reads here need: a pool, a connection or a transaction.
type DB = dbpool.DBTX

// FenceSQL finds a drainer's river_job row only while the execution ($1 the
// job id, $2 its attempted_at) is the running one, and locks it until the
// transaction ends. The hand-offs queue it first in their batches.
const FenceSQL = `SELECT 1 FROM river_job WHERE id = $1 AND state = 'running' AND attempted_at = $2 FOR UPDATE`

// FenceManySQL is FenceSQL for several executions at once ($1 the job ids,
// $2 their attempted_at): it returns (and locks, in job id order) the rows
// of those still running.
const FenceManySQL = `
	SELECT j.id FROM river_job j
	JOIN unnest($1::bigint[], $2::timestamptz[]) AS f(id, attempted_at) ON j.id = f.id AND j.attempted_at = f.attempted_at
	WHERE j.state = 'running'
	ORDER BY j.id
	FOR UPDATE OF j`

// deadLanesSQL is QueueActivation's look: the lanes of $1 without a live
// drainer (a drainer job in one of the states $2).
const deadLanesSQL = `
		SELECT n.name
		FROM unnest($1::text[]) AS n(name)
		LEFT JOIN mefor_lane l ON l.name = n.name
		LEFT JOIN river_job j ON j.id = l.job_id
		WHERE j.id IS NULL OR NOT (j.state::text = ANY($2::text[]))`

// liveDrainerCheckSQL is QueueLiveDrainerCheck's statement: the cast of a
// text naming a lane ($3, the mark, then the name) raises for each lane of
// $1 without a live drainer.
const liveDrainerCheckSQL = `
		SELECT ($3 || n.name)::int
		FROM unnest($1::text[]) AS n(name)
		LEFT JOIN mefor_lane l ON l.name = n.name
		LEFT JOIN river_job j ON j.id = l.job_id
		WHERE j.id IS NULL OR NOT (j.state::text = ANY($2::text[]))`

// WarmSQL is a statement that reads no row and loads into a session the
// descriptions of the lane registry and River's job table, for
// pipeline.WarmSession.
const WarmSQL = `SELECT 1 FROM mefor_lane l, river_job j WHERE false`

// LockDrainers locks the river_job rows of the lanes' drainers in id order
// and reports which lanes have a running one. A drainer that is not running
// cannot start until tx ends. Callers take it before any lane lock.
func LockDrainers(ctx context.Context, tx pgx.Tx, lanes []string) (map[string]bool, error) {
	sorted := slices.Clone(lanes)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	rows, err := tx.Query(ctx, `
		SELECT l.name, j.state = 'running'
		FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = ANY($1)
		ORDER BY j.id
		FOR UPDATE OF j`, sorted)
	if err != nil {
		return nil, fmt.Errorf("lock drainers of %d lane(s): %w", len(sorted), err)
	}
	running := map[string]bool{}
	var lane string
	var run bool
	if _, err := pgx.ForEachRow(rows, []any{&lane, &run}, func() error {
		running[lane] = run
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock drainers of %d lane(s): %w", len(sorted), err)
	}
	return running, nil
}

// ScheduledDrainers returns the River job ids of the lanes' drainers that
// are snoozed (state scheduled), locking those job rows until tx ends so
// they cannot start or change meanwhile. Making such a job available again
// (River's JobRetryTx) wakes the lane now instead of at the end of a backoff
// that an operator just cut short.
func ScheduledDrainers(ctx context.Context, tx pgx.Tx, lanes []string) ([]int64, error) {
	if len(lanes) == 0 {
		return nil, nil
	}
	return dbpool.Column[int64](ctx, tx, "find snoozed drainers", `
		SELECT j.id FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
		WHERE l.name = ANY($1) AND j.state = 'scheduled'
		ORDER BY j.id
		FOR UPDATE OF j`, lanes)
}

// StrandedLanes are the lanes with a pending row and no live drainer.
func StrandedLanes(ctx context.Context, db DB) ([]string, error) {
	return dbpool.Column[string](ctx, db, "find stranded lanes", `
		SELECT l.name
		FROM mefor_lane l LEFT JOIN river_job j ON j.id = l.job_id
		WHERE (j.id IS NULL OR NOT (j.state::text = ANY($1::text[])))
		  AND EXISTS (SELECT 1 FROM mefor_work w WHERE w.lane = l.name AND w.status = 'pending')`, LiveStateNames())
}

// RescuedDrainer is a drainer job RescueDeadNodeDrainers made available.
type RescuedDrainer struct {
	ID    int64
	Lane  string
	Node  string
	Queue string
}

// RescueDeadNodeDrainers makes the running drainers of the dead nodes
// available again at once. It records each rescue the way River's own
// rescuer does (an error entry at the rescue time, river:rescue_count), so
// the next execution can tell it follows one that died. River has no call
// that rescues the jobs of given workers, so this is mefor's one write to
// river_job.
func RescueDeadNodeDrainers(ctx context.Context, db DB, dead []string) ([]RescuedDrainer, error) {
	rows, err := db.Query(ctx, `
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
		RETURNING j.id, j.args->>'lane', j.attempted_by[array_length(j.attempted_by, 1)], j.queue`, dead, DrainerKinds())
	if err != nil {
		return nil, fmt.Errorf("rescue drainers of dead nodes: %w", err)
	}
	var out []RescuedDrainer
	for rows.Next() {
		var r RescuedDrainer
		if err := rows.Scan(&r.ID, &r.Lane, &r.Node, &r.Queue); err != nil {
			return out, fmt.Errorf("rescue drainers of dead nodes: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// HasDrainersOf reports whether a drainer is marked running on one of the
// nodes.
func HasDrainersOf(ctx context.Context, db DB, nodes []string) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT 1 FROM river_job j
			WHERE j.state = 'running'
			  AND j.kind = ANY($2::text[])
			  AND j.attempted_by[array_length(j.attempted_by, 1)] = ANY($1::text[]))`,
		nodes, DrainerKinds()).Scan(&found)
	if err != nil {
		return false, fmt.Errorf("look for drainers of dead nodes: %w", err)
	}
	return found, nil
}

// DrainersWaiting reports whether a job of queue is available and due:
// waiting for a slot.
func DrainersWaiting(ctx context.Context, db DB, queue string) (bool, error) {
	var waiting bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM river_job WHERE state = 'available' AND queue = $1 AND scheduled_at <= now())`,
		queue).Scan(&waiting)
	return waiting, err
}

// EarlierNotificationPending reports whether a job of kind other than id,
// for the same alert rule and sink with a lower seq, is still live.
func EarlierNotificationPending(ctx context.Context, db DB, kind string, id int64, rule, sink string, seq int64) (bool, error) {
	var earlier bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT 1 FROM river_job
			WHERE kind = $1 AND id <> $2 AND finalized_at IS NULL
			  AND args->>'rule' = $3 AND args->>'sink' = $4 AND (args->>'seq')::bigint < $5)`,
		kind, id, rule, sink, seq).Scan(&earlier)
	return earlier, err
}

// FinishedJob is the latest finished River job of a kind and args.
type FinishedJob struct {
	StartedAt  time.Time
	FinishedAt time.Time
	// State is River's final state (completed, discarded, cancelled).
	State string
	// Node is the client id of its last attempt.
	Node string
}

// LastFinishedJob is the latest finished River job of kind with exactly
// these args (River keeps finished jobs for a day); ok is false when there
// is none.
func LastFinishedJob(ctx context.Context, db DB, kind string, args []byte) (job FinishedJob, ok bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT coalesce(attempted_at, created_at), finalized_at, state::text, coalesce(attempted_by[array_length(attempted_by, 1)], '')
		FROM river_job
		WHERE kind = $1 AND args = $2::jsonb AND finalized_at IS NOT NULL
		ORDER BY id DESC LIMIT 1`, kind, args).Scan(&job.StartedAt, &job.FinishedAt, &job.State, &job.Node)
	if errors.Is(err, pgx.ErrNoRows) {
		return job, false, nil
	}
	if err != nil {
		return job, false, err
	}
	return job, true, nil
}

// LiveJob returns the id of a live (queued, scheduled or running) River job
// of kind with exactly these args, 0 if there is none, and whether it is
// running.
func LiveJob(ctx context.Context, db DB, kind string, args []byte) (id int64, running bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT id, state = 'running' FROM river_job
		WHERE kind = $1 AND args = $2::jsonb AND finalized_at IS NULL
		ORDER BY (state = 'running') DESC, id LIMIT 1`, kind, args).Scan(&id, &running)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read live %s job: %w", kind, err)
	}
	return id, running, nil
}

// InFlightDeliveries counts, per destination, the outbound lanes whose
// head is in flight: the lane's drainer is running and the head is due (a
// head waiting out its backoff has a snoozed drainer).
func InFlightDeliveries(ctx context.Context, db DB) (map[string]int64, error) {
	rows, err := db.Query(ctx, `
		SELECT h.destination, count(*)
		FROM mefor_lane l
		JOIN river_job j ON j.id = l.job_id AND j.state = 'running'
		JOIN LATERAL (
			SELECT w.destination, w.next_attempt_at FROM mefor_work w
			WHERE w.lane = l.name AND w.status = 'pending'
			ORDER BY w.seq LIMIT 1
		) h ON true
		WHERE l.stage = 'outbound' AND h.next_attempt_at <= clock_timestamp()
		GROUP BY h.destination`)
	if err != nil {
		return nil, fmt.Errorf("count deliveries in flight: %w", err)
	}
	out := map[string]int64{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
		out[name] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count deliveries in flight: %w", err)
	}
	return out, nil
}
