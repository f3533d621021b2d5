package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

// Delivery: a message reaches each of its destinations once and in order,
// a file destination writes it under a name that stays in its directory,
// and a lane's sends are recorded in windows of bounded size and age.
// Parallel and partitioned destinations spread their messages over lanes,
// each patient's messages staying in order, also when a destination's
// ordering changes while messages are queued for it.

// A message sent to a channel is acknowledged AA with its control id, reaches
// both destinations, in order, once, and ends processed.
func TestEndToEndMLLPToMLLPAndFile(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	dir := t.TempDir()
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s"}
  archive:
    type: file
    file: {directory: "%s", filename: "{{.ControlID}}.hl7"}
`, p.addr, dir))
	cluster.StartNode(t, db, cfg, nil)

	ids := controlIDs("C%03d", 20)
	acks := send(t, listen, adts(ids, patientEach)...)
	for i, a := range acks {
		if a.Code != hl7.AckAccept || a.ControlID != ids[i] {
			t.Fatalf("ack %d = %s for %q, want AA for %q", i, a.Code, a.ControlID, ids[i])
		}
	}

	fixtures.Eventually(t, 30*time.Second, "all messages delivered", func() bool { return len(p.acceptedIDs()) >= len(ids) })
	if got := p.acceptedIDs(); !slices.Equal(got, ids) {
		t.Fatalf("partner received %v, want %v (in order, once)", got, ids)
	}
	fixtures.Eventually(t, 10*time.Second, "all messages processed", func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM mefor_message WHERE status = 'processed'").Scan(&n)
		return n == len(ids)
	})
	for _, id := range ids {
		body, err := os.ReadFile(filepath.Join(dir, id+".hl7"))
		if err != nil {
			t.Fatalf("archive file for %s: %v", id, err)
		}
		if _, err := hl7.Parse(body); err != nil {
			t.Fatalf("archive file for %s is not HL7: %v", id, err)
		}
	}
}

// File names built from MSH-10 stay in the destination's directory, never
// replace another message's file or follow a planted symlink, and a name
// that cannot be written dead-letters at once with its reason, though
// retries are unlimited, so the lane moves on.
func TestFileNamesFromControlIDs(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	archive, nested, outside := t.TempDir(), t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(archive, "PLANT.hl7")); err != nil {
		t.Fatal(err)
	}
	// nested puts each file under the channel's directory, which is a
	// symlink out of it: no name there can be written.
	if err := os.Symlink(outside, filepath.Join(nested, "adt")); err != nil {
		t.Fatal(err)
	}
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  archive:
    type: file
    file: {directory: "%s", filename: "{{.ControlID}}.hl7"}
  nested:
    type: file
    file: {directory: "%s", filename: "{{.Channel}}/{{.ControlID}}.hl7"}
`, archive, nested))
	cluster.StartNode(t, db, cfg, nil)

	long := strings.Repeat("L", 300)
	ids := []string{"A/B", "..", long, "DUP", "DUP", "PLANT", "LAST", "N\x00UL"}
	for i, a := range send(t, listen, adts(ids, patientEach)...) {
		if a.Code != hl7.AckAccept {
			t.Fatalf("ack %d = %s", i, a.Code)
		}
	}

	fixtures.Eventually(t, 30*time.Second, "every message ended", func() bool {
		return countStatus(t, db, "error") == len(ids)
	})
	want := map[string]string{
		"A_B.hl7": "P0", "__.hl7": "P1", strings.Repeat("L", 100) + ".hl7": "P2",
		"DUP.hl7": "P3", "DUP.1.hl7": "P4", "PLANT.1.hl7": "P5", "LAST.hl7": "P6", "N_UL.hl7": "P7",
	}
	for name, patient := range want {
		body, err := os.ReadFile(filepath.Join(archive, name))
		if err != nil {
			t.Fatalf("archive file %s: %v", name, err)
		}
		if !strings.Contains(string(body), "PID|1||"+patient+"^") {
			t.Fatalf("archive file %s holds another message than %s's", name, patient)
		}
	}
	if entries, _ := os.ReadDir(archive); len(entries) != len(want)+1 { // the planted symlink
		t.Fatalf("archive holds %d entries, want %d", len(entries), len(want)+1)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("planted symlink followed: victim now %q", b)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Fatalf("written through the symlinked directory: %d entries outside", len(entries))
	}

	// Each nested row died at its first attempt, with the reason, and
	// neither the reason nor last_error holds the control id.
	rows := queryStrings(t, db, `
		SELECT w.status || ' ' || w.attempts || ' ' || coalesce(w.last_error, '') || ' | ' || e.detail
		FROM mefor_work w JOIN mefor_event e ON e.message_id = w.message_id AND e.event = 'dead'
		WHERE w.destination = 'nested' ORDER BY w.message_id`)
	if len(rows) != len(ids) {
		t.Fatalf("%d dead nested rows, want %d: %q", len(rows), len(ids), rows)
	}
	for _, r := range rows {
		if !strings.HasPrefix(r, "dead 1 bad-name: ") || !strings.Contains(r, "| file name cannot be written: bad-name: ") ||
			strings.Contains(r, "DUP") || strings.Contains(r, "LAST") {
			t.Fatalf("nested row %q: want dead after one attempt, the reason given, no control id", r)
		}
	}
}

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
