package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
)

// IngressWorker routes a channel's received messages.
type IngressWorker struct {
	river.WorkerDefaults[jobs.IngressArgs]
	Deps *Deps
}

func (w *IngressWorker) Timeout(*river.Job[jobs.IngressArgs]) time.Duration {
	return w.Deps.Limits.Slice + time.Minute
}

func (w *IngressWorker) Work(ctx context.Context, job *river.Job[jobs.IngressArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.routeStep)
}

// routeStep parses and routes a batch, handing all of it off in one
// transaction: routing has no side effects outside the database, so a batch
// is as safe as one row and much cheaper.
func (d *Deps) routeStep(ctx context.Context, ex store.Execution, ins jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	g := d.Graph()
	decisions := make([]store.RouteDecision, len(rows))
	var wait time.Duration
	for i, row := range rows {
		msg, err := hl7.Parse(row.Body)
		if err != nil {
			decisions[i].DeadReason = fmt.Sprintf("cannot parse stored message: %v", err)
			continue
		}
		outs, ok := g.Route(row.Channel, msg)
		if !ok && d.behind(ctx) {
			// Hand off the rows before it; hold the lane until this node
			// has applied the cluster's newer config.
			rows, decisions, wait = rows[:i], decisions[:i], behindRetry
			break
		}
		if !ok {
			decisions[i].DeadReason = fmt.Sprintf("channel %q is not in the config", row.Channel)
			continue
		}
		decisions[i].Outs = outs
	}
	if len(rows) == 0 {
		return stepResult{snooze: wait}, nil
	}
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		return store.RouteBatch(ctx, tx, ins, ex, rows, decisions)
	})
	if err != nil {
		return stepResult{}, err
	}
	d.Wake.Notify(jobs.RoutedLane(rows[0].Channel))
	return stepResult{served: len(rows), snooze: wait}, nil
}

// RoutedWorker runs handlers for a channel's routed messages.
type RoutedWorker struct {
	river.WorkerDefaults[jobs.RoutedArgs]
	Deps *Deps
}

func (w *RoutedWorker) Timeout(*river.Job[jobs.RoutedArgs]) time.Duration {
	return w.Deps.Limits.Slice + time.Minute
}

func (w *RoutedWorker) Work(ctx context.Context, job *river.Job[jobs.RoutedArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.transformStep)
}

// transformStep runs the handlers of a batch and hands it off in one
// transaction, with the transform state the batch read and wrote
// (transform_state.go): a conflict refreshes the state cache and serves the
// rows again.
func (d *Deps) transformStep(ctx context.Context, ex store.Execution, ins jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	if rows[0].DueIn > 0 {
		return stepResult{snooze: rows[0].DueIn}, nil // a held head, not due yet
	}
	g := d.Graph()
	decisions := make([]store.TransformDecision, len(rows))
	batch := d.stateBatch()
	started := time.Now()
	for i, row := range rows {
		if i > 0 && time.Since(started) > d.Limits.Slice {
			// Slow scripts: hand off what is done, so a batch of them
			// cannot outlive the drainer's job time limit.
			rows, decisions = rows[:i], decisions[:i]
			break
		}
		msg, err := hl7.Parse(row.Body)
		if err != nil {
			decisions[i].DeadReason = fmt.Sprintf("cannot parse stored message: %v", err)
			continue
		}
		st := batch.Row()
		outs, err := g.Transform(ctx, row, msg, st)
		if err != nil && ctx.Err() != nil {
			return stepResult{}, ctx.Err()
		}
		if errors.Is(err, handler.ErrNotReady) {
			// Not the message's fault (a reference set without a snapshot
			// yet, a script with on_error: hold): hand off the rows before
			// it and hold the lane at it, with backoff.
			if i == 0 {
				wait, err := d.holdHead(ctx, ex, row, err, st.Discard())
				return stepResult{snooze: wait}, err
			}
			rows, decisions = rows[:i], decisions[:i]
			break
		}
		if err != nil {
			decisions[i].DeadReason = err.Error()
			decisions[i].State = st.Discard()
			continue
		}
		decisions[i].Outs = outs
		decisions[i].State = st.Commit()
	}
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		return store.TransformBatch(ctx, tx, ins, ex, rows, decisions)
	})
	if d.stateConflict(ctx, rows[0].Lane, err) {
		return stepResult{}, nil // the drainer reads the lane and runs it again
	}
	if err != nil {
		return stepResult{}, err
	}
	d.publishState(decisions)
	for _, dec := range decisions {
		for _, o := range dec.Outs {
			d.Wake.Notify(o.Lane)
		}
	}
	return stepResult{served: len(rows)}, nil
}

// OutboundWorker delivers one destination lane.
type OutboundWorker struct {
	river.WorkerDefaults[jobs.OutboundArgs]
	Deps *Deps
	// SendTimeout bounds one delivery (connect + ACK) across destinations,
	// so the job timeout covers a slice plus one slow send.
	SendTimeout time.Duration
}

func (w *OutboundWorker) Timeout(*river.Job[jobs.OutboundArgs]) time.Duration {
	return w.Deps.Limits.Slice + w.SendTimeout + 30*time.Second
}

func (w *OutboundWorker) Work(ctx context.Context, job *river.Job[jobs.OutboundArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.deliverStep)
}

// deliverStep delivers rows one at a time, head first, each recorded in its
// own transaction: a crash repeats at most the one send in flight. A failed
// head that may be retried stops the step so the lane waits behind it.
func (d *Deps) deliverStep(ctx context.Context, ex store.Execution, _ jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	served := 0
	for _, row := range rows {
		if row.DueIn > 0 {
			return stepResult{served: served, snooze: row.DueIn}, nil
		}
		if d.stopping() {
			return stepResult{served: served}, nil
		}
		dest := d.Graph().Destination(row.Destination)
		if dest == nil && d.behind(ctx) {
			return stepResult{served: served, snooze: behindRetry}, nil
		}
		if dest == nil {
			reason := fmt.Sprintf("destination %q is not in the config", row.Destination)
			if err := d.inTx(ctx, ex, func(tx pgx.Tx) error { return store.DeadLetter(ctx, tx, row, reason) }); err != nil {
				return stepResult{served: served}, err
			}
			d.Metrics.DeadLettered(row.Destination)
			served++
			continue
		}
		sender, err := d.Senders.Get(row.Lane, dest)
		if err != nil {
			return stepResult{served: served}, err
		}
		if d.Alive != nil && !d.Alive() {
			// Not a proof that another node took the lane, but this node
			// can no longer know it did not; the fence would refuse the
			// record anyway, and the send is what must not happen.
			return stepResult{served: served}, store.ErrFenced
		}
		sent := time.Now()
		res := sender.Send(ctx, connector.Delivery{
			MessageID: row.MessageID, WorkID: row.ID, Seq: row.Seq, Lane: row.Lane, Channel: row.Channel,
			Destination: row.Destination, ControlID: row.ControlID, MessageType: row.MessageType,
			Received: row.ReceivedAt, Payload: row.Body,
		})
		took := time.Since(sent)
		attempt := store.Attempt{Outcome: res.Outcome, AckCode: res.AckCode, Reply: res.Reply, Error: res.Error}
		attempts := row.Attempts + 1
		dead := !res.OK && dest.Retry.Exhausted(attempts)
		backoff := dest.Retry.Backoff(attempts)
		if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
			_, err := store.RecordAttempt(ctx, tx, ex, row, attempt, res.OK, backoff, dead)
			return err
		}); err != nil {
			return stepResult{served: served}, err
		}
		// Counted once recorded: an attempt whose record was refused
		// (fenced) is repeated by the execution that replaced this one.
		d.Metrics.Delivered(row.Destination, metrics.OutcomeOf(res.Outcome, res.AckCode), metrics.Answered(res.Outcome), took)
		if dead {
			d.Metrics.DeadLettered(row.Destination)
		}
		if res.OK {
			served++
			continue
		}
		d.Logger.WarnContext(ctx, "delivery failed",
			"lane", row.Lane, "message_id", row.MessageID, "work_id", row.ID,
			"attempt", attempts, "outcome", res.Outcome, "dead", dead, "retry_in", backoff)
		if dead {
			served++
			continue
		}
		return stepResult{served: served, snooze: backoff}, nil
	}
	return stepResult{served: served}, nil
}
