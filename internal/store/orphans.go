package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Known is what the running config has, for DeadLetterOrphans.
type Known struct {
	Channels     []string
	Routes       []string // "channel/route"
	Handlers     []string
	Destinations []string
}

// DeadLetterOrphans dead-letters pending rows the config can no longer
// serve (their channel, route, handler or destination was removed), each
// with the reason, and finalizes their messages. It returns how many rows it
// dead-lettered. A node runs it at start so such rows show up in
// `mefor dead list` instead of blocking their lane.
func DeadLetterOrphans(ctx context.Context, pool *pgxpool.Pool, k Known) (int, error) {
	rows, err := pool.Query(ctx, `
		SELECT id, message_id, coalesce(destination, ''),
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
			OR (stage = 'outbound' AND NOT (destination = ANY($4))))
		ORDER BY id`, k.Channels, k.Routes, k.Handlers, k.Destinations)
	if err != nil {
		return 0, fmt.Errorf("find rows the config no longer serves: %w", err)
	}
	type orphan struct {
		row    WorkRow
		reason string
	}
	orphans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (orphan, error) {
		var o orphan
		err := r.Scan(&o.row.ID, &o.row.MessageID, &o.row.Destination, &o.reason)
		return o, err
	})
	if err != nil {
		return 0, fmt.Errorf("find rows the config no longer serves: %w", err)
	}
	for _, o := range orphans {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return DeadLetter(ctx, tx, o.row, o.reason) }); err != nil {
			return 0, err
		}
	}
	return len(orphans), nil
}
