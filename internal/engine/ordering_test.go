package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Ordering: parallel and partitioned destinations spread their messages
// over lanes, a patient's messages staying in order; changing a
// destination's ordering while messages are queued keeps that order.

// A parallel destination with N lanes spreads its messages over N lanes, each
// with its own connection to the partner, and delivers every message once.
func TestParallelDestinationUsesNLanes(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	const lanes = 4
	_, p, listen := startDownstream(t, db, nil, nil, fmt.Sprintf("ordering: {mode: parallel, lanes: %d}", lanes))

	ids := controlIDs("Q%03d", 40)
	send(t, listen, adts(ids, patientEach)...)
	fixtures.Eventually(t, 30*time.Second, "all delivered", func() bool { return len(p.acceptedIDs()) == len(ids) })

	got := p.acceptedIDs()
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want each of %v once", got, ids)
	}
	used := queryStrings(t, db, `SELECT DISTINCT lane FROM mefor_work WHERE stage = 'outbound' ORDER BY 1`)
	want := []string{"outbound:downstream#0", "outbound:downstream#1", "outbound:downstream#2", "outbound:downstream#3"}
	if !slices.Equal(used, want) {
		t.Fatalf("outbound lanes %v, want %v", used, want)
	}
	if c := p.connections(); c < lanes {
		t.Fatalf("partner saw %d connections, want one per lane (%d)", c, lanes)
	}
	fixtures.Eventually(t, 10*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(ids) })
}

// A destination partitioned by PID-3.1 keeps each patient's messages in the
// order they were received while spreading patients over its lanes.
func TestPartitionedDestinationKeepsPerPatientOrder(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	_, p, listen := startDownstream(t, db, nil, nil, "ordering: {mode: partitioned, lanes: 4, key: PID-3.1}")

	const patients, each = 8, 8
	patientOf := map[string]string{}
	var msgs [][]byte
	for i := range each {
		for pt := range patients {
			id := fmt.Sprintf("PT%dM%02d", pt, i)
			patientOf[id] = fmt.Sprintf("MRN%d", pt)
			msgs = append(msgs, adt(id, patientOf[id]))
		}
	}
	send(t, listen, msgs...)
	fixtures.Eventually(t, 30*time.Second, "all delivered", func() bool { return len(p.acceptedIDs()) == len(msgs) })

	perPatient := map[string][]string{}
	for _, id := range p.acceptedIDs() {
		perPatient[patientOf[id]] = append(perPatient[patientOf[id]], id)
	}
	for pt, got := range perPatient {
		if len(got) != each || !slices.IsSorted(got) {
			t.Fatalf("patient %s's messages arrived as %v, want %d in sending order", pt, got, each)
		}
	}
	// Each patient stays in one lane; patients use several lanes.
	lanesOf := queryStrings(t, db, `
		SELECT string_agg(DISTINCT w.lane, ',') FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE w.stage = 'outbound' GROUP BY split_part(m.control_id, 'M', 1)`)
	used := map[string]bool{}
	for _, l := range lanesOf {
		if strings.Contains(l, ",") {
			t.Fatalf("one patient's messages went to several lanes: %s", l)
		}
		used[l] = true
	}
	if len(lanesOf) != patients || len(used) < 2 {
		t.Fatalf("patients over lanes: %v; want %d patients spread over more than one lane", lanesOf, patients)
	}
	fixtures.Eventually(t, 10*time.Second, "all processed", func() bool { return countStatus(t, db, "processed") == len(msgs) })
}

// orderingYAML is a one-channel config delivering ADT to downstream with the
// given ordering block.
func orderingYAML(listen, partner, ordering string) string {
	return reloadYAML{listen: listen, dests: [][2]string{{"downstream", partner}},
		more: []string{"ordering: " + ordering, "retry: {backoff: 100ms, multiplier: 2, max_backoff: 1s}"}}.String()
}

// reorderCase is one way an operator changes a destination's ordering while
// messages are queued for it.
type reorderCase struct {
	name       string
	before     string // ordering block before the change
	after      string // and after
	viaRestart bool   // the node restarts with the new file; otherwise a reload
}

// Changing a destination's ordering (its mode or its lane count) while
// messages are queued for it, by reload or by restarting with the new file,
// must not let a patient's new messages overtake the older ones queued
// under the previous ordering: the old lanes drain first.
func TestOrderingChangeKeepsPerPatientOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []reorderCase{
		{name: "fifo to partitioned by reload", before: "{mode: fifo}", after: "{mode: partitioned, lanes: 4, key: PID-3.1}"},
		{name: "four lanes to two by reload", before: "{mode: partitioned, lanes: 4, key: PID-3.1}", after: "{mode: partitioned, lanes: 2, key: PID-3.1}"},
		{name: "fifo to partitioned by restart", before: "{mode: fifo}", after: "{mode: partitioned, lanes: 4, key: PID-3.1}", viaRestart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testOrderingChange(t, tc)
		})
	}
}

func testOrderingChange(t *testing.T, tc reorderCase) {
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	var up atomic.Bool // until then the partner answers AE: every delivery is retried
	p := newPartner(t, "", func(context.Context, string, int) hl7.AckCode {
		if up.Load() {
			return hl7.AckAccept
		}
		return hl7.AckError
	})
	listen := fixtures.FreeAddr(t)
	path, cfg := configFile(t, "mefor.yaml", orderingYAML(listen, p.addr, tc.before))

	const patients = 10
	var sent []string
	patientOf := map[string]string{}
	batch := func(prefix string) [][]byte {
		var msgs [][]byte
		for i := range 60 {
			id := fmt.Sprintf("%s%03d", prefix, i)
			patientOf[id] = fmt.Sprintf("MRN%d", i%patients)
			sent = append(sent, id)
			msgs = append(msgs, adt(id, patientOf[id]))
		}
		return msgs
	}
	pendingOutbound := func() int {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`)
	}

	n := cluster.Start(t, engine.Options{Config: cfg, Pool: db.Pool, Logger: fixtures.Logger(t), NodeID: "a"})
	send(t, listen, batch("A")...)
	fixtures.Eventually(t, 30*time.Second, "the first 60 queued", func() bool { return pendingOutbound() == 60 })
	// Let the old lanes' heads fail a few times, so their backoff is longer
	// than that of lanes that start fresh after the change.
	time.Sleep(2 * time.Second)

	writeFile(t, path, orderingYAML(listen, p.addr, tc.after))
	if tc.viaRestart {
		if err := n.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		next, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		cluster.StartNode(t, db, next, named("b"))
	} else if _, err := n.Reload(ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	send(t, listen, batch("B")...)
	fixtures.Eventually(t, 30*time.Second, "all 120 queued", func() bool { return pendingOutbound() == 120 })
	up.Store(true)

	// Only this test's messages: another test's may reach a partner on
	// port 0 (see ours).
	mine := func() []string {
		var out []string
		for _, id := range p.acceptedIDs() {
			if _, ok := patientOf[id]; ok {
				out = append(out, id)
			}
		}
		return out
	}
	fixtures.Eventually(t, 60*time.Second, "all 120 delivered", func() bool { return len(mine()) == len(sent) })
	perPatient := map[string][]string{}
	for _, id := range mine() {
		perPatient[patientOf[id]] = append(perPatient[patientOf[id]], id)
	}
	for pt, got := range perPatient {
		if !slices.IsSorted(got) { // A before B, each numbered in sending order
			t.Fatalf("patient %s's messages were delivered as %v: newer ones overtook older ones", pt, got)
		}
	}
}
