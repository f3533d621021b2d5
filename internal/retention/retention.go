// Package retention purges message content past its retention window and
// deletes old messages, walking them in short batches; the statements that
// write the pipeline's tables are package pipeline's (LockIdleMessages,
// DeleteMessages, PurgeBodies).
package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mefor/mefor/internal/dbpool"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/pipeline"
)

// Retention purges message content past its retention window and keeps the
// metadata, in short batches so intake never waits long behind it.
//
// Two windows decide when a message's content goes:
//
//   - a message that was never dead-lettered: KeepBodies after receipt;
//   - a message with dead letters: KeepDead after its last dead letter, so
//     a dead letter stays replayable for its own window.
//
// Purging a message nulls its raw body, the payloads and errors of its stage
// rows, the details of its events and its partners' replies, and stamps
// body_purged_at; replay then refuses it (pipeline.ErrBodyPurged). DeleteAfter, when
// set, deletes messages received before it outright, rows and all, except
// those still inside their KeepDead window. KeepErrors deletes messages
// whose status is error (they did not parse, or were dead-lettered) that
// long after they failed: their receipt, or their last dead letter.
//
// A message with a pending row is never touched, and neither is one whose
// rows or finalize lock are held by someone else at that moment (a replay, a
// finalizer): the next run gets it. Each batch locks its messages' rows with
// SKIP LOCKED and takes their finalize locks with try-locks, so it never
// waits on the pipeline and cannot deadlock with it, then re-checks "nothing
// pending" under those locks before it writes. Replay takes the same locks
// before it re-queues anything, so a message is either purged or replayed,
// never re-queued with its body gone.

// Policy is what one retention run does. Zero durations disable
// their part.
type Policy struct {
	KeepBodies  time.Duration
	KeepDead    time.Duration
	DeleteAfter time.Duration
	// KeepErrors deletes messages whose status is error this long after
	// they failed. Callers keep it at least KeepDead (config does), or a
	// dead letter goes before its content's window ends.
	KeepErrors time.Duration
	// Batch is how many messages one transaction looks at. Defaults to
	// 5000 when not positive.
	Batch int
}

// Counts is what a retention run did.
type Counts struct {
	// BodiesNulled counts messages whose content was purged.
	BodiesNulled int64 `json:"bodies_nulled"`
	// DeadPayloadsNulled counts dead-letter rows whose payload was purged
	// (a subset of the rows of the messages in BodiesNulled).
	DeadPayloadsNulled int64 `json:"dead_payloads_nulled"`
	// MessagesDeleted counts messages deleted with all their rows (past
	// DeleteAfter).
	MessagesDeleted int64 `json:"messages_deleted"`
	// ErrorsDeleted counts messages in error deleted with all their rows
	// (past KeepErrors).
	ErrorsDeleted int64 `json:"errors_deleted"`
	// Skipped counts candidates left for a later run because they had a
	// pending row, were locked by the pipeline or an operator, or (for
	// deletion) were dead-lettered within keep_dead.
	Skipped int64 `json:"skipped"`
	// Batches is how many transactions the run committed.
	Batches int `json:"batches"`
}

// Run applies p to the whole database, deletions first, in batches
// of p.Batch messages, each its own short transaction. The windows are
// measured from the database clock at the start of the run. progress, if not
// nil, is called after each batch with the counts so far. On error the counts
// say what the committed batches did.
func Run(ctx context.Context, pool *pgxpool.Pool, p Policy, progress func(Counts)) (Counts, error) {
	var c Counts
	if p.Batch <= 0 {
		p.Batch = 5000
	}
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return c, fmt.Errorf("retention: read database clock: %w", err)
	}
	cut := func(d time.Duration) time.Time {
		if d <= 0 {
			return time.Time{}
		}
		return now.Add(-d)
	}
	r := retention{pool: pool, batch: p.Batch, counts: &c, progress: progress}
	if del := cut(p.DeleteAfter); !del.IsZero() {
		if err := r.deletePass(ctx, del, cut(p.KeepDead)); err != nil {
			return c, err
		}
	}
	if errs := cut(p.KeepErrors); !errs.IsZero() {
		if err := r.errorPass(ctx, errs); err != nil {
			return c, err
		}
	}
	bodies, dead := cut(p.KeepBodies), cut(p.KeepDead)
	if !bodies.IsZero() || !dead.IsZero() {
		if err := r.bodyPass(ctx, bodies, dead); err != nil {
			return c, err
		}
	}
	return c, nil
}

type retention struct {
	pool     *pgxpool.Pool
	batch    int
	counts   *Counts
	progress func(Counts)
}

// lastIDBefore is the id of the last message received before t. Ids grow with
// receipt time, so the passes walk ids up to it and stop there instead of
// scanning messages too young to qualify.
func (r *retention) lastIDBefore(ctx context.Context, t time.Time) (int64, error) {
	var id int64
	err := r.pool.QueryRow(ctx, `
		SELECT id FROM mefor_message WHERE received_at < $1 ORDER BY received_at DESC LIMIT 1`, t).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("retention: find last message before %s: %w", t.Format(time.RFC3339), err)
	}
	// Ids are drawn before commit, so a message received just before t
	// may have a slightly larger id than one received just after; the
	// margin costs nothing as the passes also compare received_at.
	return id + 1000, nil
}

// deletePass deletes the idle messages received before cut, except those
// dead-lettered at or after deadCut: delete_after counts from receipt, and a
// dead letter keeps its keep_dead window whenever it died. A zero deadCut
// spares nothing.
func (r *retention) deletePass(ctx context.Context, cut, deadCut time.Time) error {
	var spare *time.Time
	if !deadCut.IsZero() {
		spare = &deadCut
	}
	upTo, err := r.lastIDBefore(ctx, cut)
	if err != nil || upTo == 0 {
		return err
	}
	return r.walk(ctx, upTo, `
		SELECT id FROM mefor_message
		WHERE id > $1 AND id <= $2 AND received_at < $4
		ORDER BY id LIMIT $3`, []any{cut},
		func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			n, err := pipeline.DeleteMessages(ctx, tx, ids, cut, spare)
			if err != nil {
				return err
			}
			r.counts.MessagesDeleted += n
			r.counts.Skipped += int64(len(ids)) - n
			return nil
		})
}

// errorPass deletes the idle messages in error that failed before cut. A
// message fails at or after its receipt, so only messages received before
// cut are looked at.
func (r *retention) errorPass(ctx context.Context, cut time.Time) error {
	upTo, err := r.lastIDBefore(ctx, cut)
	if err != nil || upTo == 0 {
		return err
	}
	return r.walk(ctx, upTo, `
		SELECT id FROM mefor_message
		WHERE id > $1 AND id <= $2 AND status = '`+pipeline.StatusError+`' AND received_at < $4
		ORDER BY id LIMIT $3`, []any{cut},
		func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			n, err := pipeline.DeleteErrorMessages(ctx, tx, ids, cut)
			if err != nil {
				return err
			}
			r.counts.ErrorsDeleted += n
			r.counts.Skipped += int64(len(ids)) - n
			return nil
		})
}

func (r *retention) bodyPass(ctx context.Context, bodies, dead time.Time) error {
	latest := bodies
	if dead.After(latest) {
		latest = dead
	}
	upTo, err := r.lastIDBefore(ctx, latest)
	if err != nil || upTo == 0 {
		return err
	}
	// A zero cutoff disables its window: no timestamp is before it.
	return r.walk(ctx, upTo, `
		SELECT id FROM mefor_message
		WHERE id > $1 AND id <= $2 AND body_purged_at IS NULL
		ORDER BY id LIMIT $3`, nil,
		func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			purged, deadRows, err := pipeline.PurgeBodies(ctx, tx, ids, orNever(bodies), orNever(dead))
			if err != nil {
				return err
			}
			r.counts.BodiesNulled += purged
			r.counts.DeadPayloadsNulled += deadRows
			return nil
		})
}

// orNever turns a disabled (zero) cutoff into one nothing is older than.
func orNever(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0)
	}
	return t
}

// walk runs act over the messages pick selects, batch by batch in id order,
// each batch in its own transaction. pick gets $1 = cursor, $2 = upTo,
// $3 = batch size, then extra. act gets the ids of the batch this
// transaction locked: every non-pending row of each of them and its finalize
// lock. Candidates with a pending row or held by someone else are counted
// as skipped and left for the next run.
func (r *retention) walk(ctx context.Context, upTo int64, pick string, extra []any,
	act func(ctx context.Context, tx pgx.Tx, ids []int64) error) error {
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		var seen int
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			// dbpool.Maintenance: a row lock it did not expect to meet (its
			// SKIP LOCKED / try-lock steps avoid the expected ones) fails
			// the batch within seconds, and the next run retries it.
			if _, err := tx.Exec(ctx, dbpool.Maintenance.SetLocal()); err != nil {
				return fmt.Errorf("set timeouts: %w", err)
			}
			rows, err := tx.Query(ctx, pick, append([]any{after, upTo, r.batch}, extra...)...)
			if err != nil {
				return fmt.Errorf("pick messages: %w", err)
			}
			cands, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return fmt.Errorf("pick messages: %w", err)
			}
			if seen = len(cands); seen == 0 {
				return nil
			}
			after = cands[len(cands)-1]
			ids, err := pipeline.LockIdleMessages(ctx, tx, cands)
			if err != nil {
				return err
			}
			r.counts.Skipped += int64(len(cands) - len(ids))
			if len(ids) == 0 {
				return nil
			}
			return act(ctx, tx, ids)
		})
		if err != nil {
			return fmt.Errorf("retention batch after message %d: %w", after, err)
		}
		if seen == 0 {
			return nil
		}
		r.counts.Batches++
		if r.progress != nil {
			r.progress(*r.counts)
		}
	}
}
