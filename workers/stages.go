package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// IngressWorker routes a channel's received messages.
type IngressWorker struct {
	river.WorkerDefaults[jobs.IngressArgs]
	Deps *Deps
}

func (w *IngressWorker) Timeout(*river.Job[jobs.IngressArgs]) time.Duration {
	return w.Deps.Limits.Longest() + time.Minute
}

func (w *IngressWorker) Work(ctx context.Context, job *river.Job[jobs.IngressArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.routeStep)
}

// routeStep parses and routes a batch, handing all of it off in one
// transaction: routing has no side effects outside the database, so a batch
// is as safe as one row and much cheaper.
func (d *Deps) routeStep(ctx context.Context, r *run, rows []pipeline.Row) (stepResult, error) {
	g := d.Graph()
	decisions := make([]pipeline.RouteDecision, len(rows))
	var wait time.Duration
	unknown := d.unknownPolicy()
	for i, row := range rows {
		msg, err := hl7.Parse(row.Body)
		if err != nil {
			decisions[i].DeadReason = fmt.Sprintf("cannot parse stored message: %v", err)
			continue
		}
		outs, ok := g.Route(row.Channel, msg)
		if !ok && !unknown(ctx) {
			// Hand off the rows before it and leave the lane to a node that
			// knows the channel.
			rows, decisions, wait = rows[:i], decisions[:i], unknownRetry
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
	if err := d.handOff(ctx, r, pipeline.PrepareRoute(r.ex, rows, decisions)); err != nil {
		return stepResult{}, err
	}
	d.Wake.Notify(jobs.RoutedLane(rows[0].Channel))
	return stepResult{served: len(rows), snooze: wait, drained: true}, nil
}

// RoutedWorker runs handlers for a channel's routed messages.
type RoutedWorker struct {
	river.WorkerDefaults[jobs.RoutedArgs]
	Deps *Deps
}

func (w *RoutedWorker) Timeout(*river.Job[jobs.RoutedArgs]) time.Duration {
	return w.Deps.Limits.Longest() + time.Minute
}

func (w *RoutedWorker) Work(ctx context.Context, job *river.Job[jobs.RoutedArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.transformStep)
}

// transformStep runs the handlers of a batch and hands it off in one
// transaction, with the transform state the batch read and wrote
// (transform_state.go): a conflict refreshes the state cache and serves the
// rows again.
func (d *Deps) transformStep(ctx context.Context, r *run, rows []pipeline.Row) (stepResult, error) {
	if rows[0].DueIn > 0 {
		return stepResult{snooze: rows[0].DueIn}, nil // a held head, not due yet
	}
	g := d.Graph()
	decisions := make([]pipeline.TransformDecision, len(rows))
	batch := d.stateBatch()
	started := time.Now()
	var wait time.Duration
	unknown := d.unknownPolicy()
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
				wait, err := d.holdHead(ctx, r.ex, row, err, st.Discard())
				return stepResult{snooze: wait}, err
			}
			rows, decisions = rows[:i], decisions[:i]
			break
		}
		if errors.Is(err, ErrNotInConfig) && !unknown(ctx) {
			// Its route, handler or a destination is not in this node's
			// config but may be in the cluster's: hand off the rows before
			// it and leave the lane to a node that knows it.
			st.Discard()
			rows, decisions, wait = rows[:i], decisions[:i], unknownRetry
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
	if len(rows) == 0 {
		return stepResult{snooze: wait}, nil
	}
	err := d.handOff(ctx, r, pipeline.PrepareTransform(r.ex, rows, decisions))
	if d.stateConflict(ctx, rows[0].Lane, err) {
		return stepResult{}, nil // the drainer reads the lane and runs it again
	}
	if te := (*pipeline.TamperedStateError)(nil); errors.As(err, &te) {
		return stepResult{}, d.tamperedState(ctx, r, rows, decisions, te)
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
	return stepResult{served: len(rows), snooze: wait, drained: true}, nil
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
	return w.Deps.Limits.Longest() + w.SendTimeout + 30*time.Second
}

func (w *OutboundWorker) Work(ctx context.Context, job *river.Job[jobs.OutboundArgs]) error {
	return drain(ctx, w.Deps, job, job.Args.Lane, w.Deps.deliverStep)
}

// deliverStep delivers rows one at a time, head first. Their outcomes are
// recorded in windows (window.go): a crash repeats at most the sends of the
// open window, the destination's record_batch rows. A failed head that may
// be retried ends the window and the step, so the lane waits behind it.
func (d *Deps) deliverStep(ctx context.Context, r *run, rows []pipeline.Row) (stepResult, error) {
	w := &recordWindow{d: d, r: r, woken: d.wakeC(r.lane)}
	res, err := d.deliverRows(ctx, r, w, rows)
	if err != nil && !w.empty() {
		// The error stops the lane (superseded, node not alive, a
		// database failure); what was sent before it is still worth
		// recording, and the fence refuses it if the lane moved.
		if _, ferr := w.flush(ctx); ferr != nil && !errors.Is(ferr, pipeline.ErrSuperseded) {
			d.Logger.WarnContext(ctx, "could not record a window of sends; they will be sent again",
				"lane", r.lane, "error", ferr)
		}
	}
	return res, err
}

// deliverRows serves rows, and the rows after them while a record window is
// open, leaving w empty whenever it returns without an error.
func (d *Deps) deliverRows(ctx context.Context, r *run, w *recordWindow, rows []pipeline.Row) (stepResult, error) {
	ex := r.ex
	served := 0
	// flush records the open window; cancels reports rows marked for
	// cancelling meanwhile, which must be resolved before anything else is
	// sent.
	flush := func() (cancels bool, err error) {
		rec, err := w.flush(ctx)
		return rec.CancelsPending, err
	}
	// settle flushes and, if cancels are pending, resolves them; done
	// reports that the step must end (read the lane again).
	settle := func() (done bool, err error) {
		cancels, err := flush()
		if err != nil || !cancels {
			return err != nil, err
		}
		n, err := d.cancelMarked(ctx, ex, r.lane)
		served += n
		return true, err
	}
	for i := 0; ; i++ {
		if i == len(rows) {
			// Every row read is served: unless resolving cancels asks for
			// a fresh read, the lane's end may have been reached.
			if w.empty() || served >= d.Limits.Batch || d.stopping() {
				again, err := settle()
				return stepResult{served: served, drained: !again}, err
			}
			more, err := d.moreRows(ctx, r.lane, rows[len(rows)-1].Seq, w)
			if err != nil {
				return stepResult{served: served}, err
			}
			if len(more) == 0 {
				again, err := settle()
				return stepResult{served: served, drained: !again}, err
			}
			rows, i = more, 0
		}
		row := rows[i]
		if d.stopping() {
			_, err := settle()
			return stepResult{served: served}, err
		}
		if w.expired() || (!w.empty() && (row.CancelRequested || row.Held || row.DueIn > 0)) {
			// Time is up for the open window, or the drainer is about to
			// do something else with the lane: record what was sent.
			if done, err := settle(); done || err != nil {
				return stepResult{served: served}, err
			}
		}
		if row.CancelRequested {
			// An operator cancelled it while this drainer held the lane, and
			// it has not been sent: cancel it (and any other marked row),
			// then read the lane again.
			n, err := d.cancelMarked(ctx, ex, row.Lane)
			return stepResult{served: served + n}, err
		}
		dest := d.Graph().Destination(row.Destination)
		if dest == nil && !d.mayDeadLetterUnknown(ctx) {
			// Not this node's to judge: yield the lane, without sending,
			// to a node that knows the destination.
			_, err := settle()
			return stepResult{served: served, snooze: unknownRetry}, err
		}
		if dest == nil {
			if done, err := settle(); done || err != nil {
				return stepResult{served: served}, err
			}
			reason := fmt.Sprintf("destination %q is not in the config", row.Destination)
			if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return pipeline.DeadLetter(ctx, tx, ex, row, reason) }); err != nil {
				return stepResult{served: served}, err
			}
			d.Metrics.DeadLettered(row.Destination)
			served++
			continue
		}
		if row.Held {
			// The destination's ordering changed; rows queued under the
			// previous one, in other lanes, go first.
			return stepResult{served: served, snooze: heldRetry}, nil
		}
		if row.DueIn > 0 {
			return stepResult{served: served, snooze: row.DueIn}, nil
		}
		sender, err := d.Senders.Get(row.Lane, dest)
		if err != nil {
			return stepResult{served: served}, err
		}
		if d.Alive != nil && !d.Alive() {
			// Not a proof that another node took the lane, but this node
			// can no longer know it did not; the fence would refuse the
			// record anyway, and the send is what must not happen.
			return stepResult{served: served}, pipeline.ErrNodeNotAlive
		}
		if r.rescue != nil {
			// This execution follows one that died, maybe sending this
			// row: count that attempt before sending it again (rescue.go).
			// Only the first send of an execution gets here: the window
			// is empty.
			dead, err := d.recordCrash(ctx, r, &row, dest)
			if err != nil {
				return stepResult{served: served}, err
			}
			if dead {
				served++
				continue
			}
		}
		sent := time.Now()
		res := sender.Send(ctx, connector.Delivery{
			MessageID: row.MessageID, WorkID: row.ID, Seq: row.Seq, Lane: row.Lane, Channel: row.Channel,
			Destination: row.Destination, ControlID: row.ControlID, MessageType: row.MessageType,
			Received: row.ReceivedAt, Payload: row.Body,
		})
		took := time.Since(sent)
		attempts := row.Attempts + 1
		v := judge(dest, res, attempts)
		dead, backoff := v.dead, v.backoff
		w.add(dest.RecordBatch, pipeline.Outcome{Row: row, Delivered: res.OK, Backoff: backoff, Dead: dead,
			Attempt: pipeline.Attempt{Outcome: res.Outcome, AckCode: res.AckCode, Reply: res.Reply, Error: res.Error,
				DeadReason: v.reason, ReplyTo: replyRoute(dest, res, r.ins)}}, sent, took)
		if res.OK {
			served++
			if w.full() {
				if done, err := settle(); done || err != nil {
					return stepResult{served: served}, err
				}
			}
			continue
		}
		// A failure ends the window: it is recorded after the sends
		// before it, in the same transaction.
		cancels, err := flush()
		if err != nil {
			return stepResult{served: served}, err
		}
		d.Logger.WarnContext(ctx, "delivery failed",
			"lane", row.Lane, "message_id", row.MessageID, "work_id", row.ID,
			"attempt", attempts, "outcome", res.Outcome, "dead", dead, "retry_in", backoff)
		if cancels {
			// Rows were marked for cancelling while this one was being
			// sent; it is recorded as it went. Cancel the others before
			// sending anything more, then read the lane again: the rows in
			// hand may be among them.
			n, err := d.cancelMarked(ctx, ex, row.Lane)
			return stepResult{served: served + 1 + n}, err
		}
		if dead {
			served++
			continue
		}
		return stepResult{served: served, snooze: backoff}, nil
	}
}

// cancelMarked cancels the lane's rows an operator marked for cancelling,
// in a fenced transaction.
func (d *Deps) cancelMarked(ctx context.Context, ex pipeline.Execution, lane string) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		var err error
		n, err = pipeline.CancelMarked(ctx, tx, ex, lane)
		return err
	})
	if err == nil && n > 0 {
		d.Logger.InfoContext(ctx, "cancelled deliveries an operator marked while this drainer held the lane", "lane", lane, "rows", n)
	}
	return n, err
}

// recordCrash settles the crash r follows: it records the attempt the dead
// execution may have been making on row, the lane's head, and reports
// whether that ended the row. row's attempt count is updated to match.
func (d *Deps) recordCrash(ctx context.Context, r *run, row *pipeline.Row, dest *config.Destination) (bool, error) {
	attempts := row.Attempts + 1
	dead := dest.Retry.Exhausted(attempts)
	a := pipeline.Attempt{Outcome: connector.OutcomeCrashed,
		Error: connector.OutcomeCrashed + ": the drainer serving this lane stopped (its node died or froze) while this message may have been in flight"}
	var rec pipeline.Recorded
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		var err error
		rec, err = pipeline.RecordCrash(ctx, tx, r.ex, *row, a, r.rescue.diedAt, dead)
		return err
	})
	if err != nil {
		return false, err
	}
	r.rescue = nil
	if !rec.Recorded {
		return false, nil // not due yet when the dead execution stopped: never in flight
	}
	row.Attempts = attempts
	d.Logger.WarnContext(ctx, "counted a crash against the lane's head",
		"lane", row.Lane, "message_id", row.MessageID, "work_id", row.ID, "attempt", attempts, "dead", dead)
	return dead, nil
}
