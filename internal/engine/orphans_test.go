package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Rows queued for a destination that was removed from the config are
// dead-lettered when a node starts, with that reason, instead of blocking
// their lane forever; their messages end in error.
func TestRowsOfRemovedDestinationDeadLetteredAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	down := downAddr(t) // nothing listens: deliveries to "old" stay queued
	before := testConfig(t, listen, fmt.Sprintf(`
  old:
    type: mllp
    mllp: {address: "%s"}
    retry: {backoff: 1h, max_backoff: 1h}
`, down))
	n1 := startOwnNode(t, engine.Options{Config: before, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "n1"})
	send(t, listen, adt("R1", "P1"), adt("R2", "P2"))
	fixtures.Eventually(t, 20*time.Second, "both deliveries to fail once and wait", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE destination = 'old' AND status = 'pending'`).Scan(&n)
		return n == 2
	})
	if err := n1.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	p := newPartner(t, "", nil)
	after := testConfig(t, fixtures.FreeAddr(t), fmt.Sprintf(`
  new:
    type: mllp
    mllp: {address: "%s"}
`, p.addr))
	cluster.StartNode(t, db, after, nil)

	rows, err := db.Pool.Query(ctx, `
		SELECT w.status, w.last_error, m.status
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.destination = 'old' ORDER BY w.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	count := 0
	for rows.Next() {
		var status, lastErr, msgStatus string
		if err := rows.Scan(&status, &lastErr, &msgStatus); err != nil {
			t.Fatal(err)
		}
		count++
		if status != "dead" || lastErr != `destination 'old' is not in the config` || msgStatus != "error" {
			t.Errorf("row: status %q, last_error %q, message %q; want dead, the reason, error", status, lastErr, msgStatus)
		}
	}
	if count != 2 {
		t.Fatalf("%d rows for the removed destination, want 2", count)
	}
}

// Node a runs with downstream down and 50 messages queued for it. Node b
// starts with an older file that lacks downstream. The cluster has not agreed
// on b's file (a runs another), so b must neither dead-letter those rows nor
// try to serve them: nothing ends dead, and once downstream is back node a
// delivers all 50, in order.
func TestNodeWithDifferentFileLeavesOthersRowsAlone(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	downAddr := downAddr(t) // nothing listens yet
	cfgA := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s", connect_timeout: 200ms}
    retry: {backoff: 200ms, max_backoff: 500ms}
`, downAddr))
	cluster.StartNode(t, db, cfgA, func(o *engine.Options) { o.NodeID = "a" })
	ids := controlIDs("OR%03d", 50)
	send(t, listen, adts(ids, onePatient)...)
	fixtures.Eventually(t, 30*time.Second, "all 50 queued for downstream", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE destination = 'downstream' AND status = 'pending'`) == 50
	})

	cfgB := testConfig(t, fixtures.FreeAddr(t), fmt.Sprintf(`
  archive:
    type: file
    file: {directory: %q}
`, t.TempDir()))
	cluster.StartNode(t, db, cfgB, func(o *engine.Options) { o.NodeID = "b" })
	// Give b time to do what it would: its start-up sweep and, should River
	// hand it the downstream lane, its drainer.
	time.Sleep(3 * time.Second)
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); n != 0 {
		t.Fatalf("%d rows dead-lettered by a node whose file the cluster has not agreed on", n)
	}

	p := newPartner(t, downAddr, nil)
	fixtures.Eventually(t, 60*time.Second, "all 50 delivered", func() bool { return len(ours(p.acceptedIDs(), "OR")) == len(ids) })
	if got := ours(p.acceptedIDs(), "OR"); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want all 50 in order", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); n != 0 {
		t.Fatalf("%d rows dead", n)
	}
}
