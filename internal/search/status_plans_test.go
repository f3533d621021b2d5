package search_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/testcontainers"
)

// What `mefor status`, the gauges and `messages list --status error` run
// never reads the messages or rows tables whole, however many are kept or
// queued: the counts come from the summary tables, the oldest pending row
// of each group is the first entry of its range of mefor_work_pending_age,
// and the error listing walks mefor_message_status_id newest first and
// stops at the limit. Sequential scans are disabled so the plans show what
// the indexes allow rather than what the planner prefers on a tiny table.
func TestStatusPlansReadNoWholeTable(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO mefor_message (channel, source, size, status)
			SELECT 'adt', 'test', 10, CASE WHEN i % 10 = 0 THEN 'error' ELSE 'routed' END FROM generate_series(1, 2000) i`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, destination, status)
			SELECT id, 'outbound', 'outbound:lab', channel, 'lab', CASE WHEN status = 'error' THEN 'dead' ELSE 'pending' END
			FROM mefor_message`,
		`ANALYZE mefor_message`, `ANALYZE mefor_work`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(sql string, args ...any) string {
		t.Helper()
		var p string
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
				return err
			}
			p = explain(t, tx, "", sql, args...)
			return nil
		})
		if err != nil {
			t.Fatalf("explain: %v\n%s", err, sql)
		}
		return p
	}
	bigTable := regexp.MustCompile(`(Scan|Scan Backward) (using \S+ )?on mefor_(message|work)( |$)`)
	for _, sql := range search.StatusSQL() {
		p := plan(sql)
		for _, m := range bigTable.FindAllString(p, -1) {
			// The pending groups' lookups are one index probe per group.
			if strings.Contains(m, "using mefor_work_pending_age ") {
				continue
			}
			t.Errorf("status reads a whole table (%s):\n%s\n%s", m, sql, p)
		}
	}
	if p := plan(search.BacklogSQL()); !strings.Contains(p, "mefor_work_pending_age") {
		t.Errorf("the oldest pending row is not read from mefor_work_pending_age:\n%s", p)
	}
	sql, args := search.ListMessagesSQL(search.MessageFilter{Status: pipeline.StatusError})
	p := plan(sql, args)
	if !strings.Contains(p, "Index Scan Backward using mefor_message_status_id") || strings.Contains(p, "Sort") ||
		!strings.HasPrefix(p, "Limit") {
		t.Errorf("list --status error does not walk its index newest first up to the limit:\n%s", p)
	}
}
