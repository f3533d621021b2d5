package engine_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

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
