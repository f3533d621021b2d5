package search

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
)

// pendingGroupsSQL is the pending rows of each stage, channel and
// destination (empty for ingress and routed): the count from mefor_work_count,
// and the age of the oldest from the first entry of the group's range of
// the partial index mefor_work_pending_age. Its cost follows the number of
// groups, not the rows pending.
const pendingGroupsSQL = `
	SELECT g.stage, g.channel, g.destination, g.n,
		coalesce(extract(epoch FROM clock_timestamp() - o.oldest)::float8, 0)
	FROM (
		SELECT stage, channel, destination, sum(n)::bigint AS n
		FROM mefor_work_count WHERE status = 'pending'
		GROUP BY stage, channel, destination HAVING sum(n) <> 0
	) g
	CROSS JOIN LATERAL (
		SELECT min(w.created_at) AS oldest FROM mefor_work w
		WHERE w.status = 'pending' AND w.stage = g.stage AND w.channel = g.channel
		  AND coalesce(w.destination, '') = g.destination
	) o
	ORDER BY g.stage, g.channel, g.destination`

// readPendingGroups runs pendingGroupsSQL.
func readPendingGroups(ctx context.Context, q pipeline.DBTX) ([]BacklogGroup, error) {
	return dbpool.Rows(ctx, q, "read backlog", func(r pgx.CollectableRow) (BacklogGroup, error) {
		var g BacklogGroup
		err := r.Scan(&g.Stage, &g.Channel, &g.Destination, &g.Pending, &g.OldestSeconds)
		return g, err
	}, pendingGroupsSQL)
}

// messageCountsSQL is each channel's messages by status.
const messageCountsSQL = `
	SELECT channel, status, sum(n)::bigint FROM mefor_message_count
	GROUP BY channel, status HAVING sum(n) <> 0
	ORDER BY channel, status`

// deliveryCountsSQL is each destination's lanes (that hold rows) and its
// outbound rows by status.
const deliveryCountsSQL = `
	SELECT destination, (count(DISTINCT lane) FILTER (WHERE n <> 0))::int,
		coalesce(sum(n) FILTER (WHERE status = 'pending'), 0)::bigint,
		coalesce(sum(n) FILTER (WHERE status = 'done'), 0)::bigint,
		coalesce(sum(n) FILTER (WHERE status = 'dead'), 0)::bigint,
		coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0)::bigint
	FROM (
		SELECT destination, lane, status, sum(n) AS n FROM mefor_work_count
		WHERE stage = 'outbound' GROUP BY destination, lane, status
	) c
	GROUP BY destination HAVING sum(n) <> 0
	ORDER BY destination`

// StatusSQL is the statements ReadStatus runs that read the counts and
// the pending index (not the per-lane in-flight read), for EXPLAIN in
// benchmarks and tests.
func StatusSQL() []string { return []string{messageCountsSQL, pendingGroupsSQL, deliveryCountsSQL} }
