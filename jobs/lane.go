package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// laneLockClass is the first key of the two-key advisory lock a lane is
// guarded by, so lane locks never collide with other advisory locks.
const laneLockClass int32 = 0x6d66 // "mf"

// Inserter holds the River client methods that Activate and the other
// writers of jobs need; a full *river.Client or an insert-only one (no
// workers) both satisfy it.
type Inserter interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
}

// LockLanes takes the transaction lock of every lane tx is about to write to.
// It must come before the work rows are inserted: seq values are drawn under
// the lock, so within a lane seq order is commit order. Locks are taken in
// sorted order so two transactions writing several lanes cannot deadlock.
// The drainer's "lane is empty, complete myself" step takes the same lock, so
// a row committed by a producer is either seen by that check or finds the
// drainer gone and activates a new one: no stranded backlog.
func LockLanes(ctx context.Context, tx pgx.Tx, lanes []string) error {
	b := &pgx.Batch{}
	QueueLocks(b, lanes)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock lanes %v: %w", lanes, err)
	}
	return nil
}

// laneLockKey hashes a lane name into the second lock key. A collision only
// makes two lanes share a lock, which costs concurrency, never correctness.
// LaneLock is the advisory lock (class and key) a lane's writers hold,
// for tests that check who else may take it.
func LaneLock(lane string) (class, key int32) { return laneLockClass, laneLockKey(lane) }

func laneLockKey(lane string) int32 {
	h := fnv.New32a()
	h.Write([]byte(lane))
	return int32(h.Sum32())
}

// Activate makes sure every lane has a live drainer. The caller holds the
// lanes' locks (LockLanes, same tx). A lane whose drainer is already live
// costs one indexed read and no write: inserting anyway would resolve as a
// unique conflict, which updates the drainer's river_job row per message.
func Activate(ctx context.Context, tx pgx.Tx, ins Inserter, lanes []string) error {
	b := &pgx.Batch{}
	act := QueueActivation(b, lanes)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("read drainers of lanes %v: %w", act.lanes, err)
	}
	return act.Finish(ctx, tx, ins)
}

// insertDrainers inserts (or finds, through the unique key) the drainer jobs
// of lanes, in one River insert, and records them in mefor_lane in one
// statement. It returns the queues of the drainers it inserted, and
// announces them at commit when announce is set. lanes must be distinct,
// and sorted as every writer locks them.
//
// One statement for all the lanes, not one insert and one record per lane:
// when a node starts, or its lanes have all gone quiet, a burst of traffic
// activates dozens of lanes in a few transactions, and intake's commits wait
// in line behind the one activating. Each lane's round trips held that line.
func insertDrainers(ctx context.Context, tx pgx.Tx, ins Inserter, lanes []string, announce bool) ([]string, error) {
	params := make([]river.InsertManyParams, len(lanes))
	stages := make([]string, len(lanes))
	for i, lane := range lanes {
		args, err := ArgsFor(lane)
		if err != nil {
			return nil, err
		}
		params[i] = river.InsertManyParams{Args: args}
		stages[i], _ = StageOf(lane)
	}
	res, err := ins.InsertManyTx(ctx, tx, params)
	if err != nil {
		return nil, fmt.Errorf("activate drainers of lanes %v: %w", lanes, err)
	}
	// River returns the jobs in the order given; each is matched to its
	// lane by its own args all the same, so that an order River does not
	// promise cannot record one lane's drainer under another.
	ids := make([]int64, len(lanes))
	var queues []string
	for _, r := range res {
		var a struct {
			Lane string `json:"lane"`
		}
		if err := json.Unmarshal(r.Job.EncodedArgs, &a); err != nil {
			return nil, fmt.Errorf("drainer job %d of lanes %v: %w", r.Job.ID, lanes, err)
		}
		i := slices.Index(lanes, a.Lane)
		if i < 0 || ids[i] != 0 {
			return nil, fmt.Errorf("drainer job %d is for lane %q, not one of %v once", r.Job.ID, a.Lane, lanes)
		}
		ids[i] = r.Job.ID
		if !r.UniqueSkippedAsDuplicate {
			queues = append(queues, r.Job.Queue)
		}
	}
	if slices.Contains(ids, 0) {
		return nil, fmt.Errorf("activate drainers of lanes %v: River returned %d jobs", lanes, len(res))
	}
	b := &pgx.Batch{}
	b.Queue(`
		INSERT INTO mefor_lane (name, stage, job_id, activated_at)
		SELECT name, stage, job_id, clock_timestamp()
		FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u(name, stage, job_id, n)
		ORDER BY n
		ON CONFLICT (name) DO UPDATE SET job_id = EXCLUDED.job_id, activated_at = EXCLUDED.activated_at`,
		lanes, stages, ids)
	if announce {
		queueNotify(b, queues)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("record drainers of lanes %v: %w", lanes, err)
	}
	return queues, nil
}

// QueueLocks queues the lane locks of LockLanes onto a batch, in the same
// sorted order, so a producer can take them in the round trip that carries
// its writes; LockLanes sends them alone. The batch must run inside the
// producer's transaction.
//
// Several lanes are locked by one statement, one lock after the other in
// that order: a shared hand-off turn writes into many lanes, and one
// statement per lane was a good part of its statements.
func QueueLocks(b *pgx.Batch, lanes []string) {
	sorted := slices.Clone(lanes)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	switch len(sorted) {
	case 0:
	case 1:
		b.Queue("SELECT pg_advisory_xact_lock($1, $2)", laneLockClass, laneLockKey(sorted[0]))
	default:
		keys := make([]int32, len(sorted))
		for i, lane := range sorted {
			keys[i] = laneLockKey(lane)
		}
		b.Queue(locksSQL, laneLockClass, keys)
	}
}

// locksSQL takes the lane locks of $2 in its order: a volatile function
// in the select list of a sorted query is evaluated after the sort.
const locksSQL = `SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) WITH ORDINALITY AS u(k, n) ORDER BY n`

// Activation carries the live-drainer checks queued on a batch until the
// batch has run; then Finish inserts drainers for the lanes that had none.
type Activation struct {
	lanes []string
	dead  []string
	// queues are those of the drainers FinishUnannounced inserted, for
	// QueueAnnouncement.
	queues []string
}

// QueueActivation queues Activate's live-drainer check for each lane onto a
// batch. The lanes' locks must be queued earlier on the same batch (or held);
// the check may come before or after the batch's writes to the lanes.
func QueueActivation(b *pgx.Batch, lanes []string) *Activation {
	sorted := slices.Clone(lanes)
	slices.Sort(sorted)
	a := &Activation{lanes: slices.Compact(sorted)}
	if len(a.lanes) == 0 {
		return a
	}
	b.Queue(deadLanesSQL,
		a.lanes, LiveStateNames()).Query(func(rows pgx.Rows) error {
		var err error
		a.dead, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return a
}

// ErrNoLiveDrainer fails a batch carrying QueueLiveDrainerCheck when one of
// its lanes has no live drainer: the batch's work must be redone in a
// transaction that can insert one (QueueActivation, then Finish).
var ErrNoLiveDrainer = errors.New("a lane has no live drainer")

// noDrainerMark is in the error the check raises, to tell it from others.
const noDrainerMark = "mefor: no live drainer in lane "

// isNoDrainerRaise reports whether err is the live-drainer check's raise:
// the cast of noDrainerMark and a lane name to int fails with
// invalid_text_representation (22P02), whose message quotes the text.
func isNoDrainerRaise(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, noDrainerMark)
}

// QueueLiveDrainerCheck queues onto b a statement that raises an error when
// any of lanes has no live drainer, reported as ErrNoLiveDrainer. It is for
// a batch sent outside a transaction block: PostgreSQL runs such a batch as
// one implicit transaction, committed at its end unless a statement failed,
// so the raise rolls back everything the batch wrote and its rows are never
// committed to a lane nobody drains. A Go error from a result callback would
// not do: the server has committed by the time the client reads it. The
// lanes' locks must be queued earlier on the same batch; queued before the
// batch's writes, a failed check leaves nothing written and no id drawn.
func QueueLiveDrainerCheck(b *pgx.Batch, lanes []string) {
	sorted := slices.Clone(lanes)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if len(sorted) == 0 {
		return
	}
	// The cast of a text naming the lane raises only for a row the filter
	// keeps; it depends on the row, so the planner cannot fold it into an
	// error for every execution.
	b.Queue(liveDrainerCheckSQL,
		sorted, LiveStateNames(), noDrainerMark).Query(func(rows pgx.Rows) error {
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			if isNoDrainerRaise(err) {
				return ErrNoLiveDrainer
			}
			return fmt.Errorf("check drainers of lanes %v: %w", sorted, err)
		}
		return nil
	})
}

// Finish inserts a drainer for every lane the check found without a live
// one. Call it after the batch's results are closed, in the same tx.
//
// The drainers it inserts are announced to River's producers at commit
// (NotifyQueues): River's own notification of an insert may be skipped
// when another of the client's inserts into the same queue notified just
// before, and that one's fetch may have run before this commit. The lane
// would then start only at the producers' next poll.
func (a *Activation) Finish(ctx context.Context, tx pgx.Tx, ins Inserter) error {
	if len(a.dead) == 0 {
		return nil
	}
	_, err := insertDrainers(ctx, tx, ins, a.dead, true)
	return err
}

// FinishUnannounced is Finish without the announcement: the caller sends
// it once tx has committed (QueueAnnouncement).
//
// For transactions a sender waits on. PostgreSQL commits the transactions
// that notify one at a time, holding a lock of its own across each one's
// WAL flush: when a node starts, or its lanes have gone quiet, and a burst
// activates dozens of lanes at once, their commits cannot share a flush,
// and the last sender's ACK waits for all the others' fsyncs. An
// announcement sent after the commit, in a transaction of its own, writes
// nothing to flush and holds that lock for microseconds.
func (a *Activation) FinishUnannounced(ctx context.Context, tx pgx.Tx, ins Inserter) error {
	if len(a.dead) == 0 {
		return nil
	}
	var err error
	a.queues, err = insertDrainers(ctx, tx, ins, a.dead, false)
	return err
}

// QueueAnnouncement queues onto b, a batch to send once the transaction of
// FinishUnannounced has committed, the statement that tells River's
// producers of the drainers it inserted; it reports whether it queued one
// (none when it inserted none). An announcement that fails costs only
// time: the producers find the drainers at their next poll.
func (a *Activation) QueueAnnouncement(b *pgx.Batch) bool {
	if a == nil || len(a.queues) == 0 {
		return false
	}
	queueNotify(b, a.queues)
	return true
}

// LiveStateNames are the river_job states in which a drainer holds its
// lane, for SQL that must agree with the unique rule.
func LiveStateNames() []string {
	out := make([]string, len(liveStates))
	for i, s := range liveStates {
		out[i] = string(s)
	}
	return out
}
