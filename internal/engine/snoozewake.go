package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/jobs"
)

// A drainer that yields its lane (a snooze of zero, every Limits.Slice or
// MaxRows) or waits for its head (a delivery retry, a held row: a short
// snooze) leaves its job available, or available later, and River announces
// neither: its producers would find the job only at their next poll. Served
// by the poll alone, the stage queues would have to poll often, and at idle
// those polls would be most of a node's transactions and of its CPU.
//
// The snooze waker announces them instead. River reports a snooze to this
// node's subscription once its completer has written it; the waker then
// sends River's own insert notification for the job's queue
// (jobs.NotifyQueues), at once for a job due now and at its due time for
// one due within River's scheduler interval (a longer snooze is scheduled,
// and River's scheduler announces it). Every node's producer of that queue
// then fetches, as after an insert, so the lane is served again by
// whichever node comes first, as before. The poll stays as the backstop
// for a notification lost (a subscription that overflowed, a listener
// reconnecting), at River's default of 1 s.
type snoozeWaker struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// riverSchedulerInterval is how often River's scheduler makes scheduled
// jobs available (and announces them); a snooze shorter than it leaves the
// job available with a future scheduled_at, announced by nobody.
const riverSchedulerInterval = 5 * time.Second

// notifyTimeout bounds one notification.
const notifyTimeout = 2 * time.Second

func newSnoozeWaker(pool *pgxpool.Pool, logger *slog.Logger) *snoozeWaker {
	return &snoozeWaker{pool: pool, logger: logger}
}

func isStageQueue(q string) bool {
	return q == jobs.QueueIngress || q == jobs.QueueRouted || q == jobs.QueueOutbound
}

// run announces the snoozed stage jobs events reports until ctx is done;
// a timer still armed then announces nothing (notify).
func (w *snoozeWaker) run(ctx context.Context, events <-chan *river.Event) {
	for {
		var now []string
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			now = w.take(ctx, ev, now)
		}
		// Whatever else is reported already goes in the same notification.
	more:
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					break more
				}
				now = w.take(ctx, ev, now)
			default:
				break more
			}
		}
		w.notify(ctx, now)
	}
}

// take adds ev's queue to now when its job is due, or arms a timer to
// announce it when it comes due.
func (w *snoozeWaker) take(ctx context.Context, ev *river.Event, now []string) []string {
	if ev == nil || ev.Kind != river.EventKindJobSnoozed || ev.Job == nil || !isStageQueue(ev.Job.Queue) {
		return now
	}
	q := ev.Job.Queue
	wait := time.Until(ev.Job.ScheduledAt)
	switch {
	case wait <= 0:
		return append(now, q) // NotifyQueues sends each queue once
	case wait < riverSchedulerInterval:
		time.AfterFunc(wait, func() { w.notify(ctx, []string{q}) })
	default:
		// Scheduled: River's scheduler announces it.
	}
	return now
}

// notify sends River's insert notification for queues.
func (w *snoozeWaker) notify(ctx context.Context, queues []string) {
	if len(queues) == 0 || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if err := jobs.NotifyQueues(ctx, w.pool, queues); err != nil && ctx.Err() == nil {
		// The poll finds the job all the same, a little later.
		w.logger.DebugContext(ctx, "could not announce snoozed drainers; River's poll will find them", "queues", queues, "error", err)
	}
}
