package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/audit"
)

func (f *opsFixture) auditRows(t *testing.T, args ...string) []audit.Record {
	t.Helper()
	out := f.ok(t, append([]string{"audit", "list", "--json"}, args...)...)
	var recs []audit.Record
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("audit list --json: %v\n%s", err, out)
	}
	return recs
}

func targetOf(t *testing.T, r audit.Record) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Target, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Every operator action leaves one audit row naming who did it and to
// what, with no message content; reads without content leave none; and the
// chain verifies.
func TestOperatorActionsAreAudited(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	id := strconv.FormatInt

	// Reads without content are not audited.
	f.ok(t, "messages", "list")
	f.ok(t, "messages", "show", id(f.dead, 10))
	f.ok(t, "dead", "list")
	f.ok(t, "status")
	if recs := f.auditRows(t); len(recs) != 0 {
		t.Fatalf("reads without content were audited: %+v", recs)
	}

	f.ok(t, "messages", "show", id(f.done, 10), "--body")
	f.ok(t, "messages", "list", "--text", "SECRET-PATIENT")
	f.ok(t, "replay", id(f.dead, 10))
	f.ok(t, "replay", id(f.done, 10))
	f.ok(t, "cancel", "--destination", "lab")

	file := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(file, []byte(reloadConfigYAML(unusedAddr(t), unusedAddr(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	// No node runs: the reload and the maintenance run are asked for, and
	// recorded as requested.
	f.ok(t, "reload", "--config", file, "--timeout", "1s")
	f.ok(t, "maintenance", "run", "reclaim", "--config", file)

	recs := f.auditRows(t)
	var actions []string
	for i := len(recs) - 1; i >= 0; i-- {
		actions = append(actions, recs[i].Action)
	}
	// The text search: a row for its one page of candidates (the bodies it
	// read), then what it found.
	want := []string{audit.ActionViewBody, audit.ActionSearchBodies, audit.ActionSearchBodies, audit.ActionReplay, audit.ActionReplay, audit.ActionCancel,
		audit.ActionReload, audit.ActionMaintenanceRun}
	if strings.Join(actions, ",") != strings.Join(want, ",") {
		t.Fatalf("audited actions = %v, want %v", actions, want)
	}
	for _, r := range recs {
		if r.DBRole != "postgres" || r.OSUser == "" || r.Host == "" || r.Node != "" {
			t.Errorf("row %d does not say who: %+v", r.Seq, r)
		}
		if strings.Contains(string(r.Target), "SECRET-PATIENT") || strings.Contains(string(r.Target), "MSH") {
			t.Errorf("row %d holds message content: %s", r.Seq, r.Target)
		}
	}
	byAction := func(a string) []audit.Record { return f.auditRows(t, "--action", a) }
	if v := byAction(audit.ActionViewBody); len(v) != 1 || targetOf(t, v[0])["message_id"] != float64(f.done) {
		t.Fatalf("view-body rows = %+v", v)
	}
	replays := byAction(audit.ActionReplay)
	if targetOf(t, replays[1])["message_id"] != float64(f.dead) || targetOf(t, replays[1])["rows"] != float64(1) {
		t.Fatalf("replay of the dead message: %s", replays[1].Target)
	}
	cancel := targetOf(t, byAction(audit.ActionCancel)[0])
	if cancel["destination"] != "lab" || cancel["rows"] != float64(3) {
		t.Fatalf("cancel row: %v", cancel)
	}
	if r := byAction(audit.ActionReload)[0]; r.Outcome != audit.OutcomeRequested || targetOf(t, r)["version"] != float64(1) {
		t.Fatalf("reload row: %+v %s", r, r.Target)
	}
	if r := byAction(audit.ActionMaintenanceRun)[0]; targetOf(t, r)["job"] != "reclaim" {
		t.Fatalf("maintenance row: %s", r.Target)
	}

	out := f.ok(t, "audit", "verify")
	if !strings.Contains(out, "verified: 8 rows") {
		t.Fatalf("audit verify: %s", out)
	}
	table := f.ok(t, "audit", "list")
	if !strings.Contains(table, "view-body") || !strings.Contains(table, "postgres") {
		t.Fatalf("audit list table:\n%s", table)
	}
}

// The reads that show content besides bodies are audited in the read's
// transaction, naming who: a search by patient, error texts opened with
// the keys (messages show, dead list), and an enqueue; the rows never hold
// the identifier searched for or the message.
func TestContentViewsAreAudited(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	key := newKeySpec(t, "k1")
	id := strconv.FormatInt(f.dead, 10)
	for _, args := range [][]string{
		{"messages", "list", "--patient", "SECRET-PATIENT"},
		{"messages", "show", id},
		{"dead", "list"},
	} {
		if code, out, errs := cli(t, f.db.URL, key, args...); code != 0 {
			t.Fatalf("mefor %v: exit %d\n%s%s", args, code, out, errs)
		}
	}
	msg := filepath.Join(t.TempDir(), "adt.hl7")
	if err := os.WriteFile(msg, []byte(strings.Replace(fixtureBody, "%d", "77", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	f.ok(t, "enqueue", "--channel", "adt", msg)

	recs := f.auditRows(t)
	var got []string
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		got = append(got, r.Action+"/"+r.Outcome)
		if strings.Contains(string(r.Target), "SECRET-PATIENT") || r.DBRole != "postgres" || r.OSUser == "" || r.Host == "" {
			t.Errorf("row %d: %+v %s", r.Seq, r, r.Target)
		}
	}
	want := []string{"search-patient/ok", "view-errors/ok", "view-errors/ok", "enqueue/requested", "enqueue/ok"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("audited = %v, want %v", got, want)
	}
	if m := targetOf(t, recs[3]); m["message_id"] != float64(f.dead) {
		t.Errorf("messages show row: %v", m)
	}
	if m := targetOf(t, recs[0]); m["channel"] != "adt" || m["message_id"] == nil {
		t.Errorf("enqueue row: %v", m)
	}
	// Without keys nothing is opened: messages show and dead list read
	// metadata only, and are not recorded.
	f.ok(t, "messages", "show", id)
	f.ok(t, "dead", "list")
	if n := len(f.auditRows(t)); n != len(want) {
		t.Errorf("%d rows after reads without keys, want %d", n, len(want))
	}
}

func TestReplayDeadIsAuditedPerBatch(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	f.ok(t, "replay-dead", "--destination", "lab", "--yes")
	recs := f.auditRows(t, "--action", audit.ActionReplayDead)
	if len(recs) != 1 {
		t.Fatalf("replay-dead rows = %+v; want one for its one batch", recs)
	}
	if tg := targetOf(t, recs[0]); tg["destination"] != "lab" || tg["rows"] != float64(1) || tg["matched"] != float64(1) {
		t.Fatalf("replay-dead target = %v", tg)
	}
}

// An altered or deleted row makes verify exit 1 naming it; an anchor
// catches a cut tail.
func TestAuditVerifyCommand(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	ctx := context.Background()
	for range 4 {
		f.ok(t, "messages", "show", strconv.FormatInt(f.done, 10), "--body")
	}
	anchor := strings.TrimSpace(f.ok(t, "audit", "anchor"))
	if !strings.HasPrefix(anchor, "4:") {
		t.Fatalf("anchor = %q", anchor)
	}
	f.ok(t, "audit", "verify", "--anchor", anchor)

	if _, err := f.db.Pool.Exec(ctx, `DELETE FROM mefor_audit WHERE seq = 4`); err != nil {
		t.Fatal(err)
	}
	f.ok(t, "audit", "verify") // a cut tail verifies on its own...
	code, _, errs := f.mefor(t, "audit", "verify", "--anchor", anchor)
	if code != 1 || !strings.Contains(errs, "row 4") || !strings.Contains(errs, "deleted") {
		t.Fatalf("verify --anchor after cutting the tail: exit %d, %s", code, errs)
	}

	if _, err := f.db.Pool.Exec(ctx, `UPDATE mefor_audit SET os_user = 'nobody' WHERE seq = 2`); err != nil {
		t.Fatal(err)
	}
	code, _, errs = f.mefor(t, "audit", "verify")
	if code != 1 || !strings.Contains(errs, "does not verify at row 2") {
		t.Fatalf("verify after altering row 2: exit %d, %s", code, errs)
	}
	code, out, _ := f.mefor(t, "audit", "verify", "--json")
	var v audit.Verification
	if err := json.Unmarshal([]byte(out), &v); code != 1 || err != nil || v.BadSeq != 2 {
		t.Fatalf("verify --json: exit %d, %s", code, out)
	}

	if code, _, errs := f.mefor(t, "audit", "verify", "--anchor", "nonsense"); code == 0 || !strings.Contains(errs, "SEQ:HASH") {
		t.Fatalf("bad anchor: exit %d, %s", code, errs)
	}
	if code, _, errs := f.mefor(t, "audit", "list", "--since", "yesterday"); code == 0 || !strings.Contains(errs, "--since") {
		t.Fatalf("bad --since: exit %d, %s", code, errs)
	}
}
