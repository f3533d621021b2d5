package jobs

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
