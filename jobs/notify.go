package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// River's producers fetch when told a job of their queue was inserted, and
// otherwise only at their poll. River tells them after its own inserts, but
// at most once per queue and FetchCooldown from one client: an insert
// committed in another transaction just after one that notified is
// announced by nobody, and a snoozed job that comes due (a drainer's
// yield, a short retry) never is. NotifyQueues sends River's own insert
// notification for queues, so that every node's producers of them fetch.
//
// The channel and payload are River's (its notifier's insert topic, under
// the schema River's listener uses: current_schema(), as River's client
// without a configured schema). TestActivationsAreAnnounced (jobs) and
// TestSnoozedDrainersAreAnnounced (engine) fail if River stops hearing them.
func NotifyQueues(ctx context.Context, db Execer, queues []string) error {
	if len(queues) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, notifySQL, notifyPayloads(queues))
	if err != nil {
		return fmt.Errorf("announce drainers of queues %v: %w", queues, err)
	}
	return nil
}

// queueNotify queues NotifyQueues's statement on b, for a caller that has
// other statements to send in the same round trip.
func queueNotify(b *pgx.Batch, queues []string) {
	if len(queues) > 0 {
		b.Queue(notifySQL, notifyPayloads(queues))
	}
}

const notifySQL = `SELECT pg_notify(current_schema() || '.river_insert', p) FROM unnest($1::text[]) AS p`

// notifyPayloads are River's insert notifications for queues, each once.
func notifyPayloads(queues []string) []string {
	payloads := make([]string, 0, len(queues))
	for _, q := range queues {
		p := fmt.Sprintf("{\"queue\": %q}", q)
		if !slices.Contains(payloads, p) {
			payloads = append(payloads, p)
		}
	}
	return payloads
}

// Execer is what NotifyQueues sends its statement with: a pool, a
// connection or a transaction (which sends the notification at commit).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// NewQuietInserter returns an insert-only River client whose inserts send
// no notification of their own, for a writer that announces the drainers
// it activates itself, after its commit (Activation.FinishUnannounced and
// QueueAnnouncement), or with NotifyQueues inside its transaction.
//
// River notifies inside the inserting transaction whenever its per-queue
// limit allows (FetchCooldown, a few milliseconds on a node). PostgreSQL
// commits notifying transactions one at a time, each holding its
// notification lock across its WAL flush, so intake transactions that
// activate lanes in a burst could not share a flush while River's
// notification was in them. River sends it only when its driver says it
// supports LISTEN/NOTIFY; this client's driver says it does not, and is
// River's pgx driver in every other respect.
// TestActivatingIntakeAnnouncesAfterItsCommit (store) fails if River
// notifies from this client.
func NewQuietInserter(pool *pgxpool.Pool, logger *slog.Logger) (*river.Client[pgx.Tx], error) {
	c, err := river.NewClient[pgx.Tx](quietDriver{riverpgxv5.New(pool)}, &river.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("create insert-only River client: %w", err)
	}
	return c, nil
}

// quietDriver is River's pgx driver, reporting no LISTEN/NOTIFY support.
type quietDriver struct{ *riverpgxv5.Driver }

func (quietDriver) SupportsListenNotify() bool { return false }
