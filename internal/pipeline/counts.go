package pipeline

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
