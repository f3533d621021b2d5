package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// With a record window on, a lane's sends still go one at a time in commit
// order, each message is delivered and recorded exactly once, and no record
// transaction covers more sends than the window's rows.
func TestRecordWindowKeepsOrderAndRecordsEachOnce(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newCtlPartner(t, "", nil)
	listen := fixtures.FreeAddr(t)
	const rows = 8
	cluster.StartNode(t, db, testConfig(t, listen, downstream(p.addr, fmt.Sprintf("record_batch: {rows: %d, window: 300ms}", rows))), nil)
	var ids []string
	var msgs [][]byte
	for i := range 60 {
		ids = append(ids, fmt.Sprintf("W%03d", i))
		msgs = append(msgs, adt(ids[i], fmt.Sprintf("P%d", i%3)))
	}
	send(t, listen, msgs...)
	fixtures.Eventually(t, 30*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })

	if got := p.receivedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner received %v, want each message once, in order %v", got, ids)
	}
	if n := queryInt(t, db, `
		SELECT count(*) FROM (SELECT message_id FROM mefor_event WHERE event = 'delivered'
		GROUP BY message_id HAVING count(*) = 1) x`); n != len(ids) {
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
	arrived := make(chan struct{})
	release := make(chan struct{})
	p := newCtlPartner(t, "", func(_ context.Context, id string, n int) hl7.AckCode {
		if id == "T004" && n == 1 {
			close(arrived)
			<-release
		}
		time.Sleep(60 * time.Millisecond)
		return hl7.AckAccept
	})
	listen := fixtures.FreeAddr(t)
	cluster.StartNode(t, db, testConfig(t, listen, downstream(p.addr, "record_batch: {rows: 1000, window: 100ms}")), nil)
	var msgs [][]byte
	for i := range 6 {
		msgs = append(msgs, adt(fmt.Sprintf("T%03d", i), "P1"))
	}
	send(t, listen, msgs...)
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("T004 never reached the partner")
	}
	recorded := queryInt(t, db, `SELECT count(*) FROM mefor_event WHERE event = 'delivered'`)
	close(release)
	if recorded < 2 {
		t.Fatalf("%d deliveries recorded when the fifth send went out; want at least the first two (window 100ms, sends of 60ms)", recorded)
	}
	fixtures.Eventually(t, 30*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(msgs) })
}
