package workers

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/hl7"
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
func (d *Deps) routeStep(ctx context.Context, ex execution, ins jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	g := d.Graph()
	type decision struct {
		outs   []store.RoutedOut
		reason string // non-empty: dead-letter the row
	}
	decisions := make([]decision, len(rows))
	for i, row := range rows {
		msg, err := hl7.Parse(row.Body)
		if err != nil {
			decisions[i].reason = fmt.Sprintf("cannot parse stored message: %v", err)
			continue
		}
		outs, ok := g.Route(row.Channel, msg)
		if !ok {
			decisions[i].reason = fmt.Sprintf("channel %q is not in the config", row.Channel)
			continue
		}
		decisions[i].outs = outs
	}
	err := d.inTx(ctx, ex, func(tx pgx.Tx) error {
		for i, row := range rows {
			if decisions[i].reason != "" {
				if err := store.DeadLetter(ctx, tx, row, decisions[i].reason); err != nil {
					return err
				}
				continue
			}
			if err := store.RouteHandoff(ctx, tx, ins, row, decisions[i].outs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return stepResult{}, err
	}
	return stepResult{served: len(rows)}, nil
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

func (d *Deps) transformStep(ctx context.Context, ex execution, ins jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	g := d.Graph()
	type decision struct {
		outs   []store.OutboundOut
		reason string
	}
	decisions := make([]decision, len(rows))
	var lanes []string
	for i, row := range rows {
		msg, err := hl7.Parse(row.Body)
		if err != nil {
			decisions[i].reason = fmt.Sprintf("cannot parse stored message: %v", err)
			continue
		}
		outs, err := g.Transform(ctx, row, msg)
		if err != nil {
			decisions[i].reason = err.Error()
			continue
		}
		decisions[i].outs = outs
		for _, o := range outs {
			lanes = append(lanes, o.Lane)
		}
	}
	err := d.inTx(ctx, ex, func(tx pgx.Tx) error {
		// Every lane of the batch before any message lock: the order all
		// writers follow, so a batch cannot deadlock with a replay.
		slices.Sort(lanes)
		if err := jobs.LockLanes(ctx, tx, slices.Compact(lanes)); err != nil {
			return err
		}
		for i, row := range rows {
			if decisions[i].reason != "" {
				if err := store.DeadLetter(ctx, tx, row, decisions[i].reason); err != nil {
					return err
				}
				continue
			}
			if err := store.TransformHandoff(ctx, tx, ins, row, decisions[i].outs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return stepResult{}, err
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
func (d *Deps) deliverStep(ctx context.Context, ex execution, _ jobs.Inserter, rows []store.WorkRow) (stepResult, error) {
	served := 0
	for _, row := range rows {
		if row.DueIn > 0 {
			return stepResult{served: served, snooze: row.DueIn}, nil
		}
		if d.stopping() {
			return stepResult{served: served}, nil
		}
		dest := d.Graph().Destination(row.Destination)
		if dest == nil {
			reason := fmt.Sprintf("destination %q is not in the config", row.Destination)
			if err := d.inTx(ctx, ex, func(tx pgx.Tx) error { return store.DeadLetter(ctx, tx, row, reason) }); err != nil {
				return stepResult{served: served}, err
			}
			served++
			continue
		}
		sender, err := d.Senders.Get(row.Lane, dest)
		if err != nil {
			return stepResult{served: served}, err
		}
		res := sender.Send(ctx, connector.Delivery{
			MessageID: row.MessageID, WorkID: row.ID, Seq: row.Seq, Lane: row.Lane, Channel: row.Channel,
			Destination: row.Destination, ControlID: row.ControlID, MessageType: row.MessageType,
			Received: row.ReceivedAt, Payload: row.Body,
		})
		attempt := store.Attempt{Outcome: res.Outcome, AckCode: res.AckCode, Reply: res.Reply, Error: res.Error}
		if res.OK {
			if err := d.inTx(ctx, ex, func(tx pgx.Tx) error {
				_, err := store.Delivered(ctx, tx, row, attempt)
				return err
			}); err != nil {
				return stepResult{served: served}, err
			}
			served++
			continue
		}

		attempts := row.Attempts + 1
		dead := dest.Retry.Exhausted(attempts)
		backoff := dest.Retry.Backoff(attempts)
		if err := d.inTx(ctx, ex, func(tx pgx.Tx) error {
			return store.Failed(ctx, tx, row, attempt, backoff, dead)
		}); err != nil {
			return stepResult{served: served}, err
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
