package workers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// stepResult is what serving a batch of rows decided.
type stepResult struct {
	served int
	// snooze > 0: the head must wait this long; the drainer yields its lane
	// without completing, so nothing behind the head can overtake it.
	snooze time.Duration
	// drained: every row the step was given (and any it read itself) was
	// served, and nothing it did asks for the lane to be read again at once.
	drained bool
}

// run is one execution of a drainer, as its steps see it.
type run struct {
	ex   pipeline.Execution
	ins  jobs.Inserter
	lane string
	// rescue is set while this execution follows one that died and has
	// not yet settled the crash (see rescueOf).
	rescue *rescue
	// rescues is the job's rescue count, recorded at each clean yield.
	rescues int
}

// stepFunc serves rows of a lane, head first.
type stepFunc func(ctx context.Context, r *run, rows []pipeline.Row) (stepResult, error)

// drain is the loop every stage drainer runs.
func drain[T river.JobArgs](ctx context.Context, d *Deps, job *river.Job[T], lane string, step stepFunc) error {
	if job.AttemptedAt == nil {
		return fmt.Errorf("drainer of lane %s: job %d has no attempted_at", lane, job.ID)
	}
	r := &run{
		ex:   pipeline.Execution{JobID: job.ID, AttemptedAt: *job.AttemptedAt, Keys: d.Keys},
		ins:  river.ClientFromContext[pgx.Tx](ctx),
		lane: lane,
	}
	r.rescue, r.rescues = rescueOf(job.JobRow)
	if stage, _ := jobs.StageOf(lane); stage != jobs.StageOutbound {
		// Only a send is counted: routing and transforming have no effect
		// outside the database, and a crash there repeats them harmlessly.
		r.rescue = nil
	}
	if r.rescue != nil {
		d.Logger.InfoContext(ctx, "drainer takes over from an execution that died", "lane", lane, "job_id", job.ID,
			"rescues", r.rescues)
	}
	ex := r.ex
	lim := d.Limits
	now := time.Now()
	sl := &laneHold{began: now, deadline: now.Add(sliceOf(lim.Slice))}
	served := 0
	var rate arrivals // this lane's, as this execution reads it

	for {
		d.extend(ctx, sl, job.Queue)
		if d.stopping() || served >= lim.MaxRows || time.Now().After(sl.deadline) {
			// Yield: available again at once, for this node or another.
			return r.snooze(ctx, 0)
		}
		woken := d.wakeC(lane) // before reading, so a commit in between still wakes us
		rows, err := d.readLane(ctx, lane, 0, lim.Batch)
		if err != nil {
			return err
		}
		rate.read(time.Now(), len(rows))
		if err := pipeline.OpenBodies(d.Keys, rows); err != nil {
			if done, terr := d.tampered(ctx, ex, lane, err); done {
				if errors.Is(terr, pipeline.ErrSuperseded) {
					return d.fenced(ctx, lane, ex)
				}
				if terr != nil {
					return terr
				}
				continue // the row is dead; the lane moves on
			}
			// Nothing is handed on or sent from a value that did not open:
			// the lane waits, looking again every few seconds, until the
			// node has the key (or the value is dealt with).
			d.Logger.ErrorContext(ctx, "lane held: a stored value does not open", "lane", lane, "error", err)
			return r.snooze(ctx, unopenedRetry)
		}
		if len(rows) == 0 {
			if finished, err := atLaneEnd(ctx, d, ex, job, lane, sl, woken, &rate, served); finished {
				return err
			}
			continue // woken, or a producer slipped a row in before the lock
		}
		res, err := step(ctx, r, rows)
		served += res.served
		if errors.Is(err, pipeline.ErrSuperseded) {
			return d.fenced(ctx, lane, ex)
		}
		if errors.Is(err, pipeline.ErrNodeNotAlive) {
			// Ended as a superseded execution is, for the same reasons:
			// this node may already have been replaced.
			d.Logger.WarnContext(ctx, "drainer stops: this node's heartbeat is too old to know it still holds the lane",
				"lane", lane, "job_id", ex.JobID)
			return nil
		}
		if err != nil {
			return err
		}
		if res.snooze > 0 {
			return r.snooze(ctx, res.snooze)
		}
		if res.drained && len(rows) < lim.Batch {
			// The read reached the lane's end and all of it was served, so
			// reading again now would almost always find nothing: on a
			// lightly loaded lane that empty read was one of every two. A
			// row this node's producers committed since the read has closed
			// woken (armed before it; a step reads more only once woken, so
			// woken is closed then too), and one another node committed is
			// found by the locked look at the end of the linger, as after an
			// empty read.
			d.extend(ctx, sl, job.Queue)
			if finished, err := atLaneEnd(ctx, d, ex, job, lane, sl, woken, &rate, served); finished {
				return err
			}
		}
	}
}

// tampered dead-letters the row of err (from OpenBodies, or a transform
// state value it read) when that value is tampered: altered, copied from
// another message or key, or plaintext in a sealed store. Such a value never opens, so holding the lane on it would hold it
// for good; it is never sent, and the lane moves on past it as past any
// dead letter (FIFO order of the other rows is kept). The dead letter is
// counted (mefor_tampered_total) and logged at error with ids and the key,
// never content; the dead-letter alert conditions see it. It reports
// whether it handled err; a missing key is left to hold the lane.
func (d *Deps) tampered(ctx context.Context, ex pipeline.Execution, lane string, err error) (bool, error) {
	var ue *pipeline.UnopenedError
	if !errors.As(err, &ue) || !crypt.IsTampered(err) {
		return false, nil
	}
	row := ue.Row
	dead, derr := pipeline.DeadLetterTampered(ctx, d.Pool, ex, row, ue.Err)
	if derr != nil {
		return true, derr
	}
	if dead {
		stage, _ := jobs.StageOf(lane)
		d.Metrics.Tampered(stage)
		if row.Destination != "" {
			d.Metrics.DeadLettered(row.Destination)
		}
		d.Logger.ErrorContext(ctx, "row dead-lettered as tampered: a stored value it needs does not open as sealed for its row; nothing was sent",
			"lane", lane, "work_id", row.ID, "message_id", row.MessageID, "error", ue.Err)
	}
	return true, nil
}

// sliceOf is how long one execution may keep its lane: slice, and up to a
// quarter more drawn at random (more, not less, so a busy lane yields no
// more often than every slice). Drainers that started together (a node's
// start, a burst reaching many lanes at once) would otherwise all yield
// together at every slice, and each yield costs River a snooze, a fetch and
// the next execution's first read, so a burst of yields stalls intake
// while River works through it. Drawn anew for each execution, the yields
// spread out, and stay spread.
func sliceOf(slice time.Duration) time.Duration {
	if j := slice / 4; j > 0 {
		return slice + rand.N(j)
	}
	return slice
}

// laneHold is one execution's hold on its lane: when it began, and when it
// must yield the lane (or, lingering on an empty lane, complete).
type laneHold struct {
	began, deadline time.Time
	looked          bool // extend looked during this slice
}

// extend gives sl another slice when the one it has ends within a linger
// or a quarter slice, whichever is shorter (so a drainer lingering on an
// empty lane, which completes at the end of its slice, is extended too,
// and a busy one looks near the end of its slice, not at its start), the
// execution stays within Limits.Hold, and no drainer of queue is waiting
// for a worker slot (an available job already due): that slot is then
// wanted by nobody, on this node or another, and a yield, or a completion
// on a lane that gets its next row a moment later, would only cost River a
// snooze or an insert, a fetch and the next execution's first read, many
// a second across many lanes, in bursts when drainers started together.
// It looks once per
// slice. A drainer that becomes available just after the look waits at
// most that slice, as it would have without the look; when the look
// fails, the slice ends as it would have.
func (d *Deps) extend(ctx context.Context, sl *laneHold, queue string) {
	lim := d.Limits
	if sl.looked || time.Until(sl.deadline) > min(lim.Linger, lim.Slice/4) || d.stopping() {
		return
	}
	sl.looked = true
	if sl.deadline.Sub(sl.began)+lim.Slice*5/4 > lim.Hold {
		return
	}
	waiting, err := jobs.DrainersWaiting(ctx, d.Pool, queue)
	if err != nil {
		d.Logger.DebugContext(ctx, "could not look for drainers waiting for a slot; the slice ends", "queue", queue, "error", err)
		return
	}
	if !waiting {
		sl.deadline = sl.deadline.Add(sliceOf(lim.Slice))
		sl.looked = false
	}
}

// atLaneEnd is the drainer at the end of its lane: it lingers for more, and
// if none came, completes the drainer when the lane is still empty under
// its lock. When the slice ends during the linger, an execution that served
// rows does not complete: it returns, and the drain loop yields. It reports
// whether the execution is over (completed, or superseded), with what drain
// returns; otherwise the drainer reads again (or yields).
func atLaneEnd[T river.JobArgs](ctx context.Context, d *Deps, ex pipeline.Execution, job *river.Job[T], lane string,
	sl *laneHold, woken <-chan struct{}, rate *arrivals, served int) (bool, error) {
	switch d.linger(ctx, lane, sl, job.Queue, woken, rate) {
	case lingerWork:
		return false, nil
	case lingerSliceOver:
		if served > 0 {
			// The lane is in use: yield (at the top of the loop), so its
			// drainer stays live for the next row. Completing here would
			// make the producer of that row insert a drainer, announce it
			// and wait for the announcement's commit, holding up every
			// message committed with that row; at the end of their holds,
			// busy lanes' completions would make most of the ACK latency
			// tail. An execution that
			// served nothing completes, so a quiet lane still ends its
			// drainer within a slice or a linger.
			return false, nil
		}
	}
	done, err := completeIfEmpty(ctx, d, ex, job, lane)
	if errors.Is(err, pipeline.ErrSuperseded) {
		return true, d.fenced(ctx, lane, ex)
	}
	if err != nil {
		return true, err
	}
	return done, nil
}

// snooze ends the execution cleanly, waiting d before the lane is served
// again. It records on the job that this execution ended cleanly having
// seen its rescues, unless it leaves a crash unsettled, so the next
// execution knows whether it follows one that died.
func (r *run) snooze(ctx context.Context, d time.Duration) error {
	if r.rescue == nil {
		// Outside a worker (a test driving a drainer by hand) there is
		// nowhere to record it and nothing to remember.
		_ = river.RecordOutput(ctx, cleanEnd{RescuesSeen: r.rescues})
	}
	return river.JobSnooze(d)
}

// fenced ends a superseded execution. It returns nil: any other answer would
// make River's completer move the job away from the execution that replaced
// this one (the completer does not compare attempts), and a snooze here
// would ping-pong between the two. If the job is left completed, the lane is
// re-activated by the next producer or by reclaim.
func (d *Deps) fenced(ctx context.Context, lane string, ex pipeline.Execution) error {
	d.Logger.WarnContext(ctx, "drainer superseded, stopping without further writes",
		"lane", lane, "job_id", ex.JobID, "attempted_at", ex.AttemptedAt)
	return nil
}

// linger waits on an empty lane for up to Linger, reporting whether work
// arrived: woken by this node's producers (then it may gather before it
// returns), or found by a slow poll for work other nodes committed. It
// gives up early when the node is stopping, and ends with the slice when
// the slice, with any extension, ends first.
//
// With a Wake it does not poll at all: this node's commits wake it, and
// work another node committed meanwhile is found when the linger ends, by
// the locked look that would otherwise complete the drainer
// (completeIfEmpty), so it waits at most Linger. Polling every few
// milliseconds on every lingering lane of every stage was most of the
// statements a lightly loaded node made.
func (d *Deps) linger(ctx context.Context, lane string, sl *laneHold, queue string, woken <-chan struct{}, rate *arrivals) lingerEnd {
	end := time.Now().Add(d.Limits.Linger)
	until := func() time.Time {
		if end.After(sl.deadline) {
			return sl.deadline
		}
		return end
	}
	timer := time.NewTimer(time.Until(until()))
	defer timer.Stop()
	var polls <-chan time.Time // nil: never fires
	if d.Wake == nil {
		poll := d.Limits.Poll
		if poll <= 0 {
			poll = DefaultLimits.Poll
		}
		tick := time.NewTicker(poll)
		defer tick.Stop()
		polls = tick.C
	}
	for {
		select {
		case <-ctx.Done():
			return lingerIdle
		case <-d.Stopping:
			return lingerIdle
		case <-timer.C:
			if at := until(); at.Before(end) {
				// The slice ended first: lingering goes on in another, if
				// extend gives one.
				d.extend(ctx, sl, queue)
				if sl.deadline.After(at) {
					timer.Reset(time.Until(until()))
					continue
				}
				return lingerSliceOver
			}
			return lingerIdle
		case <-woken:
			d.gather(ctx, lane, rate)
			return lingerWork
		case <-polls:
		}
		pending, err := pipeline.HasPending(ctx, d.Pool, lane)
		if err != nil {
			return lingerIdle
		}
		if pending {
			return lingerWork
		}
	}
}

// lingerEnd is why a linger ended.
type lingerEnd int

const (
	lingerIdle      lingerEnd = iota // a whole linger without work (or stopping): complete if still empty
	lingerWork                       // work arrived: read
	lingerSliceOver                  // the slice ended first: yield if the execution served rows, else as idle
)

// gather waits Limits.Gather after a wake, before the drainer reads, when
// the lane is expected to get another row within that time and the host's
// CPUs are contended. On one connection sending a message every one or two
// milliseconds, each wake would otherwise read one row and hand it off in
// a transaction of its own, at every stage, and on a host whose CPUs are
// short those transactions take the CPU the next message's intake (and
// its ACK) waits for. Waiting lets the rows committed meanwhile share the
// read and the hand-off, which costs the database less per message.
//
// It does not wait for company it does not expect: on a lane whose rows
// come further apart than Gather, a wait only delays the row in hand. Nor
// does it wait with CPU to spare: the pipeline's commits then come sooner
// and smaller, and deferring them would make every WAL flush longer and
// the ACKs that wait for one slower. A row is delayed by at
// most Gather at each stage; a drainer that starts on a quiet lane knows
// no rate yet and reads at once. Stopping ends the wait; the drain loop
// then yields.
func (d *Deps) gather(ctx context.Context, lane string, rate *arrivals) {
	g := d.Limits.Gather
	if g <= 0 || rate.expected(g) < 1 || d.Contended == nil || !d.Contended() {
		return
	}
	stage, _ := jobs.StageOf(lane)
	d.Metrics.Gathered(stage)
	timer := time.NewTimer(g)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-d.Stopping:
	case <-timer.C:
	}
}

// arrivals estimates how fast rows come to a lane, from the drainer's own
// reads: the rows each read found over the time since the previous one,
// smoothed so that one burst or one pause does not decide alone. It is
// kept per execution, so a drainer that starts knows nothing yet.
type arrivals struct {
	last    time.Time
	perSec  float64
	samples int
}

// arrivalsWeight is the share of the newest read in the estimate.
const arrivalsWeight = 0.25

// read takes a read at now that found rows. The first read of an
// execution only starts the clock: what it finds is the backlog, not a
// rate.
func (a *arrivals) read(now time.Time, rows int) {
	if a.last.IsZero() {
		a.last = now
		return
	}
	dt := now.Sub(a.last).Seconds()
	a.last = now
	if dt <= 0 {
		return
	}
	inst := float64(rows) / dt
	if a.samples == 0 {
		a.perSec = inst
	} else {
		a.perSec += arrivalsWeight * (inst - a.perSec)
	}
	a.samples++
}

// expected is how many rows the lane should get within d.
func (a *arrivals) expected(d time.Duration) float64 {
	if a == nil {
		return 0
	}
	return a.perSec * d.Seconds()
}

func (d *Deps) wakeC(lane string) <-chan struct{} {
	if d.Wake == nil {
		return nil // never fires: poll only
	}
	return d.Wake.C(lane)
}

// completeIfEmpty completes the drainer's job in the same transaction that
// saw the lane empty under the lane lock.
func completeIfEmpty[T river.JobArgs](ctx context.Context, d *Deps, ex pipeline.Execution, job *river.Job[T], lane string) (bool, error) {
	done := false
	err := pgx.BeginTxFunc(ctx, d.Pool, pipeline.PipelineTx, func(tx pgx.Tx) error {
		if err := pipeline.Fence(ctx, tx, ex); err != nil {
			return err
		}
		empty, err := pipeline.CompleteIfEmpty(ctx, tx, lane)
		if err != nil || !empty {
			return err
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("complete drainer of lane %s: %w", lane, err)
		}
		done = true
		return nil
	})
	return done, err
}
