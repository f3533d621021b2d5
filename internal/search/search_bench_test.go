package search_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/apiserver"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkSearch1M times each `messages list` filter on a store of a
// million messages (MEFOR_BENCH_MESSAGES overrides the count), bulk-loaded
// by SQL, and prints one line:
//
//	BENCH search-1m control_id_ms=… patient_ms=… … text_ms=…
//
// Each figure is the median of several runs of search.ListMessages with the
// default limit. It fails when a filter other than --text is planned as a
// sequential scan of messages or rows, and shows that the cluster gauges'
// backlog read goes through the partial index on pending rows
// (mefor_work_pending_age). Run it on
// its own:
//
//	go test -run '^$' -bench Search1M -benchtime 1x -timeout 30m ./internal/search/
func BenchmarkSearch1M(b *testing.B) {
	n := fixtures.BenchMessages(1_000_000)
	ctx := context.Background()
	for range b.N {
		db := fixtures.BenchDB(b, func(db *testcontainers.DB) string {
			loadSearchCorpus(b, db, n)
			return fmt.Sprintf("loaded %d messages and %d work rows", n, n+n/10_000+n/200)
		})

		type filter struct {
			name string
			f    search.MessageFilter
		}
		now := time.Now()
		mid := n / 2
		span := time.Duration(n) * 2 * time.Second // the corpus reaches this far back
		filters := []filter{
			{"control_id", search.MessageFilter{ControlID: fmt.Sprintf("C%d", mid)}},
			{"patient", search.MessageFilter{Patient: fmt.Sprintf("P%d", mid%200_000)}},
			{"type", search.MessageFilter{Type: "ADT^A08"}},
			{"type_rare", search.MessageFilter{Type: "ORM"}}, // 1 in 50,000
			{"since", search.MessageFilter{Since: now.Add(-2 * time.Hour)}},
			{"until", search.MessageFilter{Until: now.Add(-span / 2)}},
			{"window", search.MessageFilter{Since: now.Add(-span * 2 / 3), Until: now.Add(-span*2/3 + time.Hour)}},
			{"destination", search.MessageFilter{Destination: "lab"}},
			{"destination_rare", search.MessageFilter{Destination: "rare"}},
			{"channel_type_since", search.MessageFilter{Channel: "adt", Type: "ADT", Since: now.Add(-24 * time.Hour)}},
			{"patient_since", search.MessageFilter{Patient: fmt.Sprintf("P%d", mid%200_000), Since: now.Add(-30 * 24 * time.Hour)}},
			{"text", search.MessageFilter{Text: fmt.Sprintf("|C%d|", mid)}},
		}
		var line []string
		b.StartTimer()
		for _, fl := range filters {
			var found int
			ms := medianMS(b, func() error {
				got, err := search.ListMessages(ctx, db.Pool, fl.f)
				if err != nil {
					return fmt.Errorf("%s: %w", fl.name, err)
				}
				found = len(got)
				return nil
			})
			line = append(line, fmt.Sprintf("%s_ms=%.2f", fl.name, ms))
			sql, args := search.ListMessagesSQL(fl.f)
			plan := explain(b, db.Pool, "", sql, args)
			b.Logf("%s: %d found, median %.2f ms\n%s", fl.name, found, ms, plan)
			if fl.name != "text" && strings.Contains(plan, "Seq Scan") {
				b.Errorf("%s is planned with a sequential scan:\n%s", fl.name, plan)
			}
			if found == 0 {
				b.Errorf("%s found nothing: the corpus or the filter is wrong", fl.name)
			}
		}
		b.StopTimer()
		fmt.Printf("BENCH search-1m %s\n", strings.Join(line, " "))
		benchAPIMessages(b, db)

		joined := explain(b, db.Pool, "", search.BacklogSQL())
		b.Logf("cluster gauges' backlog read:\n%s", joined)
		if !strings.Contains(joined, "mefor_work_pending_age") {
			b.Errorf("the backlog read does not use the partial index on pending rows:\n%s", joined)
		}
		t0 := time.Now()
		if _, err := search.ReadBacklog(ctx, db.Pool); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("BENCH gauges-backlog-1m pending_rows=%d read_ms=%.2f\n", n/200, float64(time.Since(t0).Microseconds())/1000)
	}
}

// loadSearchCorpus writes n processed messages received one every two
// seconds up to now (about 23 days for a million), on three channels, 10%
// ORU^R01, 1 in 50,000 ORM^O01 and the rest ADT (1 in 7 of them A08), a patient id shared by
// every 200,000th message, and one outbound row each to lab, ehr or billing;
// every 10,000th also went to rare, and every 200th delivery to lab is
// still pending.
func loadSearchCorpus(b *testing.B, db *testcontainers.DB, n int) {
	b.Helper()
	ctx := context.Background()
	stmts := []string{
		`INSERT INTO mefor_message (channel, received_at, updated_at, source, control_id, message_type, trigger_event,
			size, raw, status, patient_key)
		SELECT (ARRAY['adt', 'lab', 'rad'])[1 + i % 3],
			clock_timestamp() - ($1 - i) * interval '2 seconds', clock_timestamp(), 'bench', 'C' || i,
			CASE WHEN i % 50000 = 0 THEN 'ORM' WHEN i % 10 = 0 THEN 'ORU' ELSE 'ADT' END,
			CASE WHEN i % 50000 = 0 THEN 'O01' WHEN i % 10 = 0 THEN 'R01' WHEN i % 7 = 0 THEN 'A08' ELSE 'A01' END,
			120, convert_to('MSH|^~\&|REG|HOSP|EHR|HOSP|20260101120000||ADT^A01|C' || i || '|P|2.5' || chr(13) ||
				'PID|1||P' || (i % 200000) || '^^^HOSP^MR||DOE^JANE' || chr(13), 'UTF8'),
			'processed', 'P' || (i % 200000)
		FROM generate_series(1, $1::int) AS i`,
		`INSERT INTO mefor_work (message_id, stage, lane, seq, channel, route, handler, destination, status, attempts, created_at, finished_at)
		SELECT id, 'outbound', 'outbound:' || d, id, channel, 'all', 'passthrough', d,
			CASE WHEN d = 'lab' AND id % 200 = 0 THEN 'pending' ELSE 'done' END, 1, received_at, received_at
		FROM (SELECT id, channel, received_at, (ARRAY['lab', 'ehr', 'billing'])[1 + id % 3] AS d FROM mefor_message) m`,
		`INSERT INTO mefor_work (message_id, stage, lane, seq, channel, route, handler, destination, status, attempts, created_at, finished_at)
		SELECT id, 'outbound', 'outbound:rare', id, channel, 'all', 'passthrough', 'rare', 'done', 1, received_at, received_at
		FROM mefor_message WHERE id % 10000 = 0`,
		`INSERT INTO mefor_lane (name, stage) VALUES ('outbound:lab', 'outbound'), ('outbound:ehr', 'outbound'),
			('outbound:billing', 'outbound'), ('outbound:rare', 'outbound')`,
		`VACUUM ANALYZE mefor_message`,
		`VACUUM ANALYZE mefor_work`,
	}
	for _, s := range stmts {
		var err error
		if strings.Contains(s, "$1") {
			_, err = db.Pool.Exec(ctx, s, n)
		} else {
			_, err = db.Pool.Exec(ctx, s)
		}
		if err != nil {
			b.Fatalf("load corpus: %v\n%s", err, s)
		}
	}
}

// benchAPIMessages times GET /api/v1/messages with a filter over real
// HTTPS, authentication included, on the same store: for a user who sees
// every channel, and for one scoped to a channel pattern (the scope is
// part of the query). (A patient search needs the encryption keys the
// corpus is not indexed under; its query is timed above.) It prints
//
//	BENCH api-messages-1m filter_ms=… scoped_ms=…
func benchAPIMessages(b *testing.B, db *testcontainers.DB) {
	b.Helper()
	srv := apiserver.Start(b, db)
	all := srv.Token(b, "ana", identity.RoleOperator)
	lab := srv.Token(b, "leo", identity.RoleViewer, "la*")
	since := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)
	call := func(method, path, token, body string) func() error {
		return func() error {
			req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := srv.Client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var got struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK || len(got.Messages) == 0 {
				return fmt.Errorf("%s %s: %d, %d messages, %v", method, path, resp.StatusCode, len(got.Messages), err)
			}
			return nil
		}
	}
	filter := medianMS(b, call("GET", "/api/v1/messages?channel=adt&type=ADT&since="+url.QueryEscape(since), all, ""))
	scoped := medianMS(b, call("GET", "/api/v1/messages?type=ADT&since="+url.QueryEscape(since), lab, ""))
	fmt.Printf("BENCH api-messages-1m filter_ms=%.2f scoped_ms=%.2f\n", filter, scoped)
}
