package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// With a record window on, a lane's sends still go one at a time in commit
// order, each message is delivered and recorded exactly once, and no record
// transaction covers more sends than the window's rows.
func TestRecordWindowKeepsOrderAndRecordsEachOnce(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	const rows = 8
	_, p, listen := startDownstream(t, db, nil, nil, fmt.Sprintf("record_batch: {rows: %d, window: 300ms}", rows))
	ids := controlIDs("W%03d", 60)
	send(t, listen, adts(ids, func(i int) string { return fmt.Sprintf("P%d", i%3) })...)
	fixtures.Eventually(t, 30*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })

	if got := p.receivedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner received %v, want each message once, in order %v", got, ids)
	}
	if n := deliveredOnce(t, db); n != len(ids) {
		t.Fatalf("%d messages have exactly one delivered event, want %d", n, len(ids))
	}
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_response WHERE outcome = 'delivered'`); n != len(ids) {
		t.Fatalf("%d delivered responses recorded, want %d", n, len(ids))
	}
	// Rows a record transaction wrote share its xmin.
	perRecord := queryInt(t, db, `SELECT max(n) FROM (SELECT count(*) AS n FROM mefor_work
		WHERE stage = 'outbound' GROUP BY xmin::text) x`)
	if perRecord > rows {
		t.Fatalf("a record transaction covered %d sends; record_batch rows is %d", perRecord, rows)
	}
	t.Logf("%d record transactions for %d deliveries, at most %d per transaction",
		queryInt(t, db, `SELECT count(DISTINCT xmin::text) FROM mefor_work WHERE stage = 'outbound'`), len(ids), perRecord)
}

// A window is recorded once its time is up, even while the lane keeps
// sending: with sends of at least 60ms and a 100ms window, no window holds
// more than two sends, so by the time the fifth send reaches the partner
// the first two are recorded.
func TestRecordWindowClosesOnTime(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	held := newGate(t)
	holdT004 := holdFirst(held, "T004")
	_, _, listen := startDownstream(t, db, func(ctx context.Context, id string, n int) hl7.AckCode {
		code := holdT004(ctx, id, n)
		time.Sleep(60 * time.Millisecond)
		return code
	}, nil, "record_batch: {rows: 1000, window: 100ms}")
	msgs := adts(controlIDs("T%03d", 6), onePatient)
	send(t, listen, msgs...)
	held.wait(t, "T004")
	recorded := queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`)
	held.let()
	if recorded < 2 {
		t.Fatalf("%d deliveries recorded when the fifth send went out; want at least the first two (window 100ms, sends of 60ms)", recorded)
	}
	fixtures.Eventually(t, 30*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(msgs) })
}
