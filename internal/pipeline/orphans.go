package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/jobs"
)

// Known is what the running config has, for DeadLetterOrphans.
type Known struct {
	Channels     []string
	Routes       []string // "channel/route"
	Handlers     []string
	Destinations []string
}

// orphanSQL selects the pending rows the config k ($1..$4) can no longer
// serve, with the reason; extra conditions follow as "AND ...".
const orphanSQL = `
	SELECT id, message_id, lane,
		CASE
			WHEN NOT (channel = ANY($1)) THEN format('channel %L is not in the config', channel)
			WHEN stage = 'routed' AND NOT (channel || '/' || route = ANY($2))
				THEN format('route %L of channel %L is not in the config', route, channel)
			WHEN stage = 'routed' AND NOT (handler = ANY($3))
				THEN format('handler %L is not in the config', handler)
			WHEN stage = 'outbound' AND NOT (destination = ANY($4))
				THEN format('destination %L is not in the config', destination)
		END AS reason
	FROM mefor_work
	WHERE status = 'pending'
	  AND (NOT (channel = ANY($1))
		OR (stage = 'routed' AND (NOT (channel || '/' || route = ANY($2)) OR NOT (handler = ANY($3))))
		OR (stage = 'outbound' AND NOT (destination = ANY($4))))`

type orphan struct {
	id, messageID int64
	reason        string
}

// orphanLanes lists the lanes that hold rows the config k can no longer
// serve: one string per lane, however many rows each holds.
func orphanLanes(ctx context.Context, q DBTX, k Known) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT lane FROM (`+orphanSQL+`) o GROUP BY lane ORDER BY lane`,
		k.Channels, k.Routes, k.Handlers, k.Destinations)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// readLaneOrphans reads the first limit orphans of lane, head first.
func readLaneOrphans(ctx context.Context, q DBTX, k Known, lane string, limit int) ([]orphan, error) {
	rows, err := q.Query(ctx, orphanSQL+` AND lane = $5 ORDER BY seq LIMIT $6`,
		k.Channels, k.Routes, k.Handlers, k.Destinations, lane, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (orphan, error) {
		var o orphan
		var lane string
		err := r.Scan(&o.id, &o.messageID, &lane, &o.reason)
		return o, err
	})
}

// DeadLetterOrphans dead-letters pending rows the config k can no longer
// serve (their channel, route, handler or destination was removed), each
// with the reason, and finalizes their messages. It returns how many rows it
// dead-lettered. A node runs it when it starts or reloads, and only when k
// is the cluster's agreed config (ReadConfigAgreement): a node with an
// older or different file may lack what the others still serve.
//
// Each lane is handled in its own transaction under its drainer's job lock
// and the lane's lock, the order a drainer takes them, so no drainer is in
// the middle of a hand-off of those rows. A lane whose drainer is running is
// left alone: that drainer reaches the rows and dead-letters them itself,
// fenced, as it meets them.
func DeadLetterOrphans(ctx context.Context, pool *pgxpool.Pool, k Known) (int, error) {
	return deadLetterOrphans(ctx, pool, k, orphanChunk)
}

func deadLetterOrphans(ctx context.Context, pool *pgxpool.Pool, k Known, chunk int) (int, error) {
	lanes, err := orphanLanes(ctx, pool, k)
	if err != nil {
		return 0, fmt.Errorf("find rows the config no longer serves: %w", err)
	}
	total := 0
	for try := 0; len(lanes) > 0; try++ {
		if try > 0 {
			// A running drainer is usually between two sends or about to
			// snooze; look again shortly rather than leave its rows for as
			// long as its head's backoff.
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(orphanRetry):
			}
		}
		var busy []string
		for _, lane := range lanes {
			n, running, err := deadLetterLaneOrphans(ctx, pool, k, lane, chunk)
			if err != nil {
				return total, err
			}
			total += n
			if running {
				busy = append(busy, lane)
			}
		}
		if try == orphanTries-1 {
			break // their drainers dead-letter them as they reach them
		}
		lanes = busy
	}
	return total, nil
}

// orphanChunk bounds the rows dead-lettered in one transaction, and so what
// the node holds in memory: a destination removed with a million deliveries
// queued for it is dead-lettered in a hundred transactions, not read whole.
const orphanChunk = 10_000

// orphanTries and orphanRetry bound how long DeadLetterOrphans waits for a
// lane's running drainer to stop.
const (
	orphanTries = 15
	orphanRetry = 200 * time.Millisecond
)

// deadLetterLaneOrphans dead-letters the orphans of one lane, chunk rows
// per transaction, unless its drainer is running, which it reports.
func deadLetterLaneOrphans(ctx context.Context, pool *pgxpool.Pool, k Known, lane string, chunk int) (int, bool, error) {
	total := 0
	for {
		n, running, err := deadLetterLaneChunk(ctx, pool, k, lane, chunk)
		total += n
		if err != nil || running || n < chunk {
			return total, running, err
		}
	}
}

// deadLetterLaneChunk dead-letters up to chunk orphans from the head of
// lane, in one transaction under the lane's drainer job lock and lane lock;
// nothing when its drainer is running, which it reports.
func deadLetterLaneChunk(ctx context.Context, pool *pgxpool.Pool, k Known, lane string, chunk int) (int, bool, error) {
	n := 0
	running := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := jobs.LockDrainers(ctx, tx, []string{lane})
		if running = r[lane]; err != nil || running {
			return err
		}
		if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
			return err
		}
		// Read again under the locks: a drainer may have served some.
		orphans, err := readLaneOrphans(ctx, tx, k, lane, chunk)
		if err != nil {
			return fmt.Errorf("find rows of lane %s the config no longer serves: %w", lane, err)
		}
		if len(orphans) == 0 {
			return nil
		}
		ids := make([]int64, len(orphans))
		msgs := make([]int64, len(orphans))
		reasons := make([]string, len(orphans))
		for i, o := range orphans {
			ids[i], msgs[i], reasons[i] = o.id, o.messageID, o.reason
		}
		b := &pgx.Batch{}
		QueueDeadLetter(b, ids, reasons)
		QueueFinalize(b, msgs)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("dead-letter rows of lane %s the config no longer serves: %w", lane, err)
		}
		n = len(orphans)
		return nil
	})
	return n, running, err
}
