package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The summary counts (migration 014): statement-level triggers on
// mefor_message and mefor_work append one delta row per key a statement
// changed, in the statement's own transaction, to mefor_message_count and
// mefor_work_count. A key's count is the sum of its rows, which in any
// snapshot equals the count(*) of that snapshot. FoldCounts keeps the
// tables small.

// FoldCounts replaces each key's delta rows by one row holding their sum,
// and drops keys that sum to zero, so that reading the counts costs about
// one row per key. It touches only keys with more than one row (or a zero
// sum), so on an idle cluster it writes nothing. Running it concurrently
// with writers or with itself keeps every sum: it deletes only rows its
// snapshot sees and inserts exactly their sum, in one statement.
func FoldCounts(ctx context.Context, q DBTX) (folded int64, err error) {
	for _, f := range []struct{ table, key string }{
		{"mefor_message_count", "channel, status"},
		{"mefor_work_count", "stage, channel, destination, lane, status"},
	} {
		var n int64
		err := q.QueryRow(ctx, `
			WITH k AS (
				SELECT `+f.key+` FROM `+f.table+` GROUP BY `+f.key+` HAVING count(*) > 1 OR sum(n) = 0
			), d AS (
				DELETE FROM `+f.table+` c USING k WHERE `+keyJoin(f.key)+`
				RETURNING c.*
			), ins AS (
				INSERT INTO `+f.table+` (`+f.key+`, n)
				SELECT `+f.key+`, sum(n) FROM d GROUP BY `+f.key+` HAVING sum(n) <> 0
			)
			SELECT count(*) FROM d`).Scan(&n)
		if err != nil {
			return folded, fmt.Errorf("fold %s: %w", f.table, err)
		}
		folded += n
	}
	return folded, nil
}

// keyJoin is "c.a = k.a AND c.b = k.b" for the key columns "a, b".
func keyJoin(key string) string {
	var eq []string
	for _, col := range strings.Split(key, ",") {
		col = strings.TrimSpace(col)
		eq = append(eq, "c."+col+" = k."+col)
	}
	return strings.Join(eq, " AND ")
}

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
func readPendingGroups(ctx context.Context, q DBTX) ([]BacklogGroup, error) {
	rows, err := q.Query(ctx, pendingGroupsSQL)
	if err != nil {
		return nil, fmt.Errorf("read backlog: %w", err)
	}
	groups, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BacklogGroup, error) {
		var g BacklogGroup
		err := r.Scan(&g.Stage, &g.Channel, &g.Destination, &g.Pending, &g.OldestSeconds)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("read backlog: %w", err)
	}
	return groups, nil
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

// VerifyCounts compares the summary counts with a full count(*) of
// mefor_message and mefor_work (but for done ingress and routed rows,
// which are not counted) in q's snapshot and returns an error naming
// every key where they differ. It scans both tables: it is for tests and
// for checking a database by hand, never for status.
func VerifyCounts(ctx context.Context, q DBTX) error {
	rows, err := q.Query(ctx, `
		WITH c AS (
			SELECT channel, status, sum(n)::bigint AS n FROM mefor_message_count GROUP BY channel, status HAVING sum(n) <> 0
		), a AS (
			SELECT channel, status, count(*) AS n FROM mefor_message GROUP BY channel, status
		)
		SELECT 'messages ' || channel || ' ' || status, coalesce(c.n, 0), coalesce(a.n, 0)
		FROM c FULL JOIN a USING (channel, status) WHERE c.n IS DISTINCT FROM a.n
		UNION ALL
		SELECT * FROM (
			WITH c AS (
				SELECT stage, channel, destination, lane, status, sum(n)::bigint AS n FROM mefor_work_count
				GROUP BY stage, channel, destination, lane, status HAVING sum(n) <> 0
			), a AS (
				SELECT stage, channel, coalesce(destination, '') AS destination, lane, status, count(*) AS n
				FROM mefor_work WHERE stage = 'outbound' OR status <> 'done'
				GROUP BY stage, channel, coalesce(destination, ''), lane, status
			)
			SELECT 'rows ' || stage || ' ' || channel || ' ' || destination || ' ' || lane || ' ' || status,
				coalesce(c.n, 0), coalesce(a.n, 0)
			FROM c FULL JOIN a USING (stage, channel, destination, lane, status) WHERE c.n IS DISTINCT FROM a.n
		) w
		ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("verify counts: %w", err)
	}
	var key string
	var counted, actual int64
	var bad []string
	_, err = pgx.ForEachRow(rows, []any{&key, &counted, &actual}, func() error {
		bad = append(bad, fmt.Sprintf("%s: counted %d, count(*) %d", key, counted, actual))
		return nil
	})
	if err != nil {
		return fmt.Errorf("verify counts: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("summary counts differ from the tables: %s", strings.Join(bad, "; "))
	}
	return nil
}
