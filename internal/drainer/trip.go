package drainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
)

// ErrNeedsTx means a hand-off could not be sent as one trip and nothing of
// it was committed: a lane it writes to has no live drainer (inserting one
// is River's insert, which needs a transaction), or it reads and writes
// transform state, whose conflicts are judged in Go before the commit. The
// caller sends the same hand-off in a transaction instead.
var ErrNeedsTx = errors.New("hand-off needs a transaction")

// Batcher sends a batch outside a transaction block (a pool or a
// connection).
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// A Trip sends a hand-off as one round trip outside a transaction block:
// PostgreSQL runs such a batch as one implicit transaction, committed at its
// end unless a statement failed. So every check that must refuse it raises
// in the database: the fence (fenceTripSQL), the live-drainer check of the
// lanes it writes (jobs.QueueLiveDrainerCheck), and it carries no Go-side
// check. A transaction block costs two more round trips (BEGIN, COMMIT),
// and a lightly loaded lane pays them at every stage for every message.
//
// The same transaction ends by reading the drainer's lane again (Lane):
// the rows it returns are what the drain loop's next read would have
// returned, one transaction earlier. It runs after the hand-off's writes,
// under the fence's row lock, with a snapshot taken after everything before
// it, so it sees every row committed before the hand-off reached it.
type Trip struct {
	DB Batcher
	// Lane, when set, is read at the end of the transaction, Limit rows at
	// most.
	Lane  string
	Limit int
	// Next is what the read returned, once the trip committed; Read
	// reports that it ran.
	Next []Row
	Read bool
	// Live, when set, is asked first whether every lane the hand-off writes
	// has a live drainer; if it says no, the hand-off is not tried as a
	// trip (ErrNeedsTx), sparing a transaction the database would refuse.
	// Only the database's own check is trusted for a yes.
	Live func(lanes []string) bool
}

// send runs h as one trip, or returns ErrNeedsTx having committed nothing.
func (t *Trip) send(ctx context.Context, h *handoff) error {
	t.Next, t.Read = nil, false
	if len(h.checks) > 0 || (t.Live != nil && len(h.activate) > 0 && !t.Live(h.activate)) {
		return ErrNeedsTx
	}
	b := &pgx.Batch{}
	if !h.ex.unfenced() {
		b.Queue(fenceTripSQL, h.ex.JobID, h.ex.AttemptedAt).QueryRow(func(r pgx.Row) error {
			var one int64
			err := r.Scan(&one)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "22012" {
				return ErrSuperseded
			}
			if err != nil {
				return fmt.Errorf("fence check of job %d: %w", h.ex.JobID, err)
			}
			return nil
		})
	}
	b.QueuedQueries = append(b.QueuedQueries, h.b.QueuedQueries...)
	// After the writes, whose lane locks come first: a drainer completing
	// takes the same lock to look at its lane, so either it sees these rows
	// or this check sees it gone.
	jobs.QueueLiveDrainerCheck(b, h.activate)
	if len(h.finalize) > 0 {
		store.QueueFinalize(b, h.finalize)
	}
	var next []Row
	if t.Lane != "" {
		queuePendingRows(b, t.Lane, 0, t.Limit, &next)
	}
	err := t.DB.SendBatch(ctx, b).Close()
	if errors.Is(err, jobs.ErrNoLiveDrainer) {
		return ErrNeedsTx
	}
	if err != nil {
		return err
	}
	t.Next, t.Read = next, t.Lane != ""
	return nil
}

// fenceTripSQL is fenceSQL for a trip: it raises (a division by the number
// of rows found) when the execution is not the running one, so the whole
// implicit transaction rolls back; it locks the river_job row as fenceSQL
// does.
const fenceTripSQL = `SELECT 1 / count(*) FROM (
	SELECT 1 FROM river_job WHERE id = $1 AND state = 'running' AND attempted_at = $2 FOR UPDATE) f`
