package workers

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
)

// The transform step's side of transform state and of held messages.

// stateBatch starts the state view of one run over a batch.
func (d *Deps) stateBatch() *state.Batch {
	if d.State == nil {
		// No cache: every key reads as absent and the hand-off's check
		// corrects it, one conflict at a time. Correct, only slower.
		return state.NewBatch(state.Map{})
	}
	return state.NewBatch(d.State)
}

// stateConflict reports whether the hand-off failed because state changed
// under the batch; it refreshes the cache with the committed values, so
// the batch's next run reads them.
func (d *Deps) stateConflict(ctx context.Context, lane string, err error) bool {
	var c *pipeline.StateConflict
	if !errors.As(err, &c) {
		return false
	}
	if d.State != nil {
		d.State.Put(c.Current)
	}
	d.Logger.DebugContext(ctx, "transform state changed under the batch; running it again",
		"lane", lane, "keys", len(c.Current), "rows_changed", c.RowsChanged)
	return true
}

// publishState records a committed hand-off's writes in the cache.
func (d *Deps) publishState(decisions []pipeline.TransformDecision) {
	if d.State == nil {
		return
	}
	var committed map[state.Key]state.Entry
	for _, dec := range decisions {
		if dec.DeadReason != "" || dec.State == nil {
			continue
		}
		for _, w := range dec.State.Writes {
			if w.Version == state.Superseded {
				continue
			}
			if committed == nil {
				committed = map[state.Key]state.Entry{}
			}
			committed[w.Key] = state.Entry{Value: w.Value, Version: w.Version}
		}
	}
	d.State.Put(committed)
}

// Held heads wait holdBackoff(n) before their n+1'th try: quick at first,
// for a reference set about to be synced, then no more than maxHoldBackoff
// apart, so a lane unblocks soon after its cause is fixed.
const (
	firstHoldBackoff = time.Second
	maxHoldBackoff   = 10 * time.Second
)

func holdBackoff(attempts int) time.Duration {
	b := firstHoldBackoff
	for i := 1; i < attempts && b < maxHoldBackoff; i++ {
		b *= 2
	}
	return min(b, maxHoldBackoff)
}

// holdHead records why the lane's head waits (its attempt count, the
// reason, when to try again) and returns how long to snooze. A held row
// never reaches the hand-off that would check what it read, and what it
// waits for may well be a state value another lane or node is writing: so
// the values it read are refreshed from the database for its next try.
func (d *Deps) holdHead(ctx context.Context, ex pipeline.Execution, row pipeline.Row, why error, read *state.Change) (time.Duration, error) {
	wait := holdBackoff(row.Attempts + 1)
	err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		return pipeline.RecordHold(ctx, tx, ex, row, why.Error(), wait)
	})
	if err != nil {
		return 0, err
	}
	if d.State != nil && len(read.Reads) > 0 {
		keys := make([]state.Key, len(read.Reads))
		for i, r := range read.Reads {
			keys[i] = r.Key
		}
		current, err := pipeline.LoadState(ctx, d.Pool, d.Keys, keys)
		if err != nil {
			return 0, err
		}
		d.State.Put(current)
	}
	d.Logger.InfoContext(ctx, "transform cannot run this message yet; lane held",
		"lane", row.Lane, "message_id", row.MessageID, "attempt", row.Attempts+1, "retry_in", wait, "error", script.LogText(why))
	return wait, nil
}

// tamperedState handles a hand-off refused because a state value the batch
// read does not open as sealed for its key (te): the first row that read
// it is dead-lettered as tampered, as a row whose own body is tampered
// would be, after the rows before it are handed off. Such a value never
// opens, so holding the lane on it would hold it for good; each later
// message that reads it is dead-lettered in turn (and counted and
// alerted) until an administrator removes or rewrites the value, and can
// then be replayed. The drainer reads the lane again afterwards.
func (d *Deps) tamperedState(ctx context.Context, r *run, rows []pipeline.Row, decisions []pipeline.TransformDecision,
	te *pipeline.TamperedStateError) error {
	first := slices.IndexFunc(decisions, func(dec pipeline.TransformDecision) bool {
		return dec.State != nil && slices.ContainsFunc(dec.State.Reads, func(rd state.Read) bool { return rd.Key == te.Key })
	})
	if first < 0 {
		return te
	}
	if first > 0 {
		err := d.handOff(ctx, r, pipeline.PrepareTransform(r.ex, rows[:first], decisions[:first]))
		if d.stateConflict(ctx, rows[0].Lane, err) {
			return nil
		}
		if err != nil {
			return err
		}
		d.publishState(decisions[:first])
		for _, dec := range decisions[:first] {
			for _, o := range dec.Outs {
				d.Wake.Notify(o.Lane)
			}
		}
		return nil
	}
	_, err := d.tampered(ctx, r.ex, r.lane, &pipeline.UnopenedError{Row: rows[0], Err: te})
	return err
}
