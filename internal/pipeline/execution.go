package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/jobs"
)

// ErrSuperseded means the drainer execution is no longer the running one for
// its job: River (or reclaim) rescued it and may have started it again
// elsewhere. The caller must roll back and stop without touching its lane
// again.
var ErrSuperseded = errors.New("drainer execution superseded (job rescued or finished elsewhere)")

// ErrNodeNotAlive means the drainer's node can no longer be sure the rest of
// the cluster counts it as alive (its heartbeat went unconfirmed for too
// long): its lanes may have been handed on, so it must not send. Unlike
// ErrSuperseded it is known before any database check: nothing proves the
// lane moved, only that this node cannot know it did not.
var ErrNodeNotAlive = errors.New("this node's heartbeat is too old to go on serving lanes")

// Execution identifies one run of a drainer job for the fence check: River
// stamps attempted_at at every fetch, so it changes when the job is rescued
// and fetched again, even though a snooze gives the attempt number back.
type Execution struct {
	JobID       int64
	AttemptedAt time.Time
	// Keys seals the content the execution's hand-offs and delivery
	// records write (payloads, replies, errors, transform state); nil
	// writes it in clear (encryption off).
	Keys *crypt.Keyring
}

// NoFence is the execution of callers that are not drainers (operator
// tools, tests): their hand-offs skip the fence check. A drainer always
// passes its own execution.
var NoFence = Execution{}

// WithKeys returns ex sealing with kr.
func (ex Execution) WithKeys(kr *crypt.Keyring) Execution {
	ex.Keys = kr
	return ex
}

// unfenced reports whether ex is NoFence (with or without keys).
func (ex Execution) unfenced() bool { return ex.JobID == 0 && ex.AttemptedAt.IsZero() }

// Fence checks, inside tx, that ex is still the running execution of its
// job, and locks that river_job row until tx ends so a rescue cannot slip in
// before commit. It returns ErrSuperseded otherwise.
func Fence(ctx context.Context, tx pgx.Tx, ex Execution) error {
	var one int
	err := tx.QueryRow(ctx, jobs.FenceSQL, ex.JobID, ex.AttemptedAt).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrSuperseded
	}
	if err != nil {
		return fmt.Errorf("fence check of job %d: %w", ex.JobID, err)
	}
	return nil
}

// The hand-offs are sent as one pgx batch each: the fence check, the lane
// locks, the set-based writes for every row served, the finalizer and the
// live-drainer checks travel in one round trip, executed in order inside the
// drainer's transaction. Each statement still gets its own snapshot (read
// committed), so the finalizer, queued after its lock, sees everything
// committed before the lock was granted. If the fence fails, the caller's
// transaction is rolled back with everything queued.

// handoff accumulates one transaction's batch.
type handoff struct {
	b        pgx.Batch
	fenced   bool // set by the fence query when the execution is current
	finalize []int64
	// checks run after the batch, once the fence held; an error rolls the
	// hand-off back (transform state: state.go).
	checks []func() error
	// keys seals what the hand-off writes.
	keys *crypt.Keyring
}

func newHandoff(ex Execution) *handoff {
	h := &handoff{keys: ex.Keys}
	if ex.unfenced() {
		h.fenced = true
		return h
	}
	h.b.Queue(jobs.FenceSQL, ex.JobID, ex.AttemptedAt).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			h.fenced = true
		}
		return rows.Err()
	})
	return h
}

// deadLetter queues dead-lettering of rows with their reasons.
func (h *handoff) deadLetter(rows []Row, reasons []string) {
	if len(rows) == 0 {
		return
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
		h.finalize = append(h.finalize, r.MessageID)
	}
	sealed := make([]string, len(reasons))
	for i, r := range reasons {
		sealed[i] = h.keys.SealString(ColError, MessageRow(rows[i].MessageID), r)
	}
	QueueDeadLetter(&h.b, ids, sealed)
}

// run sends the batch, checks the fence, finalizes and activates lanes.
func (h *handoff) run(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, act *jobs.Activation) error {
	if len(h.finalize) > 0 {
		QueueFinalize(&h.b, h.finalize)
	}
	if err := tx.SendBatch(ctx, &h.b).Close(); err != nil {
		return err
	}
	if !h.fenced {
		return ErrSuperseded
	}
	for _, check := range h.checks {
		if err := check(); err != nil {
			return err
		}
	}
	if act != nil && ins != nil {
		return act.Finish(ctx, tx, ins)
	}
	return nil
}
