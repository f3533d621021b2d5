package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
)

// These tests run the operator's read and write commands (messages, status,
// dead, replay, cancel) in-process against databases whose contents they
// know, and check what the commands print.

// opsFixture is a database holding, on channel adt:
//
//	done:   delivered to lab (partner answered AA)
//	dead:   dead-lettered for lab
//	queued: pending for lab
//	fresh:  just received, not routed
type opsFixture struct {
	db                        *testcontainers.DB
	q                         *river.Client[pgx.Tx]
	done, dead, queued, fresh int64
	// keys is the commands' MEFOR_ENCRYPTION_KEYS ("": unset).
	keys string
}

// emptyOpsFixture is an opsFixture whose database holds no message yet.
func emptyOpsFixture(t *testing.T) *opsFixture {
	t.Helper()
	db := testcontainers.NewDB(t)
	q, err := ops.NewQueue(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &opsFixture{db: db, q: q}
}

const fixtureBody = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|CTRL%d|P|2.5\rPID|1||SECRET-PATIENT\r"

func newOpsFixture(t *testing.T) *opsFixture {
	t.Helper()
	ctx := context.Background()
	f := emptyOpsFixture(t)
	db, q := f.db, f.q
	inTx := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db.Pool, fn); err != nil {
			t.Fatal(err)
		}
	}
	head := func(lane string, msg int64) pipeline.Row {
		t.Helper()
		rows, err := pipeline.PendingRows(ctx, db.Pool, lane, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.MessageID == msg {
				return r
			}
		}
		t.Fatalf("message %d not pending in %s", msg, lane)
		return pipeline.Row{}
	}
	n := 0
	receive := func() int64 {
		n++
		var id int64
		inTx(func(tx pgx.Tx) error {
			var err error
			id, err = pipeline.Receive(ctx, tx, q, pipeline.Inbound{
				Channel: "adt", Source: "test",
				Raw:       []byte(strings.Replace(fixtureBody, "%d", strconv.Itoa(n), 1)),
				ControlID: "CTRL" + strconv.Itoa(n), MessageType: "ADT", TriggerEvent: "A01",
			})
			return err
		})
		return id
	}
	const lab = "outbound:lab"
	toLab := func() int64 {
		id := receive()
		row := head(jobs.IngressLane("adt"), id)
		inTx(func(tx pgx.Tx) error {
			return pipeline.RouteHandoff(ctx, tx, q, row, []pipeline.RoutedOut{{Route: "all", Handler: "pass"}})
		})
		row = head(jobs.RoutedLane("adt"), id)
		inTx(func(tx pgx.Tx) error {
			return pipeline.TransformHandoff(ctx, tx, q, row, []pipeline.OutboundOut{{Destination: "lab", Lane: lab}})
		})
		return id
	}
	f.done = toLab()
	f.dead = toLab()
	f.queued = toLab()
	f.fresh = receive()
	inTx(func(tx pgx.Tx) error {
		_, err := pipeline.Delivered(ctx, tx, head(lab, f.done), pipeline.Attempt{Outcome: "delivered", AckCode: "AA", Reply: []byte("MSH|ACK\rMSA|AA\r")})
		return err
	})
	inTx(func(tx pgx.Tx) error {
		return pipeline.Failed(ctx, tx, head(lab, f.dead), pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: "partner rejected: AR"}, 0, true)
	})
	return f
}

// mefor runs the CLI in-process against the fixture's database.
func (f *opsFixture) mefor(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runEnv(append(args, "--database-url", f.db.URL), &out, &errb, envWith(f.keys))
	return code, out.String(), errb.String()
}

func (f *opsFixture) ok(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := f.mefor(t, args...)
	if code != 0 {
		t.Fatalf("mefor %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

func TestMessagesListCLI(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)

	list := decode[[]search.MessageSummary](t, f.ok(t, "messages", "list", "--json"))
	var ids []int64
	for _, m := range list {
		ids = append(ids, m.ID)
	}
	if want := []int64{f.fresh, f.queued, f.dead, f.done}; !slices.Equal(ids, want) {
		t.Fatalf("messages list ids = %v, want newest first %v", ids, want)
	}
	if m := list[len(list)-1]; m.Channel != "adt" || m.Type() != "ADT^A01" || m.ControlID != "CTRL1" || m.Status != "processed" || m.Size == 0 {
		t.Fatalf("oldest message = %+v", m)
	}

	errs := decode[[]search.MessageSummary](t, f.ok(t, "messages", "list", "--status", "error", "--json"))
	if len(errs) != 1 || errs[0].ID != f.dead {
		t.Fatalf("--status error = %+v, want message %d only", errs, f.dead)
	}
	if got := decode[[]search.MessageSummary](t, f.ok(t, "messages", "list", "--limit", "2", "--json")); len(got) != 2 {
		t.Fatalf("--limit 2 gave %d messages", len(got))
	}
	if got := f.ok(t, "messages", "list", "--channel", "nope", "--json"); strings.TrimSpace(got) != "[]" {
		t.Fatalf("empty listing JSON = %q, want []", got)
	}

	out := f.ok(t, "messages", "list")
	for _, want := range []string{"ID", "CONTROL ID", "ADT^A01", "CTRL2", "error", "processed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("messages list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "SECRET-PATIENT") {
		t.Fatalf("messages list printed message content:\n%s", out)
	}
}

func TestMessagesShowCLI(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	id := strconv.FormatInt(f.done, 10)

	out := f.ok(t, "messages", "show", id)
	for _, want := range []string{"Channel:", "adt", "processed", "CTRL1", "Stage rows:", "outbound:lab", "ingress:adt",
		"Partner replies:", "AA", "Timeline:", "delivered", "transformed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("messages show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "SECRET-PATIENT") || strings.Contains(out, "MSA|AA") {
		t.Fatalf("messages show without --body printed content:\n%s", out)
	}

	out = f.ok(t, "messages", "show", id, "--body")
	if !strings.Contains(out, "\nPID|1||SECRET-PATIENT\n") || strings.Contains(out, "\r") {
		t.Fatalf("--body does not print segments as lines:\n%q", out)
	}
	if !strings.Contains(out, "\nMSA|AA\n") {
		t.Fatalf("--body does not print the partner's reply:\n%s", out)
	}

	type shown struct {
		Message search.MessageDetail `json:"message"`
		Work    []search.WorkInfo    `json:"work"`
		Replies []struct {
			AckCode string  `json:"ack_code"`
			Body    *string `json:"body"`
		} `json:"replies"`
		Events []search.Event `json:"events"`
		Body   *string        `json:"body"`
	}
	v := decode[shown](t, f.ok(t, "messages", "show", id, "--json"))
	if v.Body != nil || v.Message.ID != f.done || len(v.Work) != 3 || len(v.Replies) != 1 || v.Replies[0].Body != nil || len(v.Events) != 4 {
		t.Fatalf("show --json = %+v", v)
	}
	v = decode[shown](t, f.ok(t, "messages", "show", id, "--json", "--body"))
	if v.Body == nil || !strings.Contains(*v.Body, "\rPID|1||SECRET-PATIENT\r") {
		t.Fatalf("show --json --body body = %v, want the raw message with \\r", v.Body)
	}
	if v.Replies[0].Body == nil || *v.Replies[0].Body != "MSH|ACK\rMSA|AA\r" {
		t.Fatalf("show --json --body reply = %v", v.Replies[0].Body)
	}

	code, stdout, stderr := f.mefor(t, "messages", "show", "987654")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "message 987654 not found") {
		t.Fatalf("show unknown: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestStatusCLI(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)

	st := decode[search.Status](t, f.ok(t, "status", "--json"))
	if len(st.Channels) != 1 || len(st.Destinations) != 1 {
		t.Fatalf("status = %+v", st)
	}
	ch, d := st.Channels[0], st.Destinations[0]
	if ch.Channel != "adt" || ch.Received != 4 || ch.Queued != 1 || ch.ByStatus["processed"] != 1 ||
		ch.ByStatus["error"] != 1 || ch.ByStatus["routed"] != 1 || ch.ByStatus["received"] != 1 {
		t.Fatalf("channel = %+v", ch)
	}
	if d.Destination != "lab" || d.Lanes != 1 || d.Queued != 1 || d.Delivered != 1 || d.Dead != 1 || d.Cancelled != 0 || d.OldestQueuedSeconds == nil {
		t.Fatalf("destination = %+v", d)
	}

	out := f.ok(t, "status")
	for _, want := range []string{"CHANNEL", "adt", "DESTINATION", "IN FLIGHT", "lab"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
}

func TestDeadReplayCancelCLI(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)

	dead := decode[[]search.DeadRow](t, f.ok(t, "dead", "list", "--json"))
	if len(dead) != 1 || dead[0].MessageID != f.dead || dead[0].Destination != "lab" || dead[0].Attempts != 1 || dead[0].LastError != "partner rejected: AR" {
		t.Fatalf("dead list = %+v", dead)
	}
	if out := f.ok(t, "dead", "list", "--destination", "lab"); !strings.Contains(out, "partner rejected: AR") {
		t.Fatalf("dead list:\n%s", out)
	}
	if out := f.ok(t, "dead", "list", "--destination", "other"); !strings.Contains(out, "no dead letters") {
		t.Fatalf("dead list for another destination:\n%s", out)
	}

	// Not on a terminal and no --yes: refused, nothing changed.
	code, _, stderr := f.mefor(t, "replay-dead", "--destination", "lab")
	if code != 1 || !strings.Contains(stderr, "--yes") {
		t.Fatalf("replay-dead without --yes: exit %d, stderr %q", code, stderr)
	}
	if got := decode[[]search.DeadRow](t, f.ok(t, "dead", "list", "--json")); len(got) != 1 {
		t.Fatalf("replay-dead without --yes changed the dead letters: %+v", got)
	}
	res := decode[ops.BulkResult](t, f.ok(t, "replay-dead", "--destination", "lab", "--yes", "--json"))
	if res.Matched != 1 || res.Rows != 1 {
		t.Fatalf("replay-dead = %+v", res)
	}
	if out := f.ok(t, "replay-dead", "--yes"); !strings.Contains(out, "no dead deliveries match") {
		t.Fatalf("second replay-dead:\n%s", out)
	}

	// Replay a delivered message: re-sent.
	r := decode[pipeline.ReplayResult](t, f.ok(t, "replay", strconv.FormatInt(f.done, 10), "--json"))
	if r.Rows != 1 || r.Mode != pipeline.ReplayResend || r.Status != pipeline.StatusRouted {
		t.Fatalf("replay delivered = %+v", r)
	}
	// A just-received message: its pending ingress row is re-queued in place.
	if out := f.ok(t, "replay", strconv.FormatInt(f.fresh, 10)); !strings.Contains(out, "re-queued 1 dead or pending row(s); status received") {
		t.Fatalf("replay fresh:\n%s", out)
	}
	code, _, stderr = f.mefor(t, "replay", "99999")
	if code != 1 || !strings.Contains(stderr, "message 99999 not found") {
		t.Fatalf("replay unknown: exit %d, stderr %q", code, stderr)
	}

	// Cancel everything queued for lab: done (re-sent), dead (replayed), queued.
	c := decode[ops.BulkResult](t, f.ok(t, "cancel", "--destination", "lab", "--json"))
	if c.Rows != 3 || c.Messages != 3 {
		t.Fatalf("cancel = %+v, want 3 rows of 3 messages", c)
	}
	st := decode[search.Status](t, f.ok(t, "status", "--json"))
	if d := st.Destinations[0]; d.Queued != 0 || d.Cancelled != 3 {
		t.Fatalf("after cancel lab = %+v", d)
	}
	if out := f.ok(t, "cancel", "--destination", "lab", "--top"); !strings.Contains(out, "nothing cancelled") {
		t.Fatalf("cancel --top with nothing blocked:\n%s", out)
	}
	// Nothing to replay any more for a message whose only delivery was
	// cancelled: exit 0, says so.
	if out := f.ok(t, "replay", strconv.FormatInt(f.queued, 10)); !strings.Contains(out, "nothing to replay") {
		t.Fatalf("replay of a cancelled message:\n%s", out)
	}
}

func TestFmtAge(t *testing.T) {
	t.Parallel()
	for sec, want := range map[float64]string{0.4: "0s", 59: "59s", 61: "1m1s", 3600 + 120: "1h2m", 3*86400 + 4*3600 + 5: "3d4h"} {
		s := sec
		if got := fmtAge(&s); got != want {
			t.Errorf("fmtAge(%v) = %q, want %q", sec, got, want)
		}
	}
	if got := fmtAge(nil); got != "-" {
		t.Errorf("fmtAge(nil) = %q", got)
	}
}

func TestBodyTextLatin1(t *testing.T) {
	t.Parallel()
	s, cs := bodyText([]byte("PID|1||M\xfcller\r"))
	if s != "PID|1||Müller\r" || cs != "iso-8859-1" {
		t.Fatalf("bodyText = %q, %q", s, cs)
	}
	if _, cs := bodyText([]byte("PID|1||Müller\r")); cs != "utf-8" {
		t.Fatalf("utf-8 body reported as %s", cs)
	}
}

// searchFixture holds messages that differ in one searchable property
// each, so every filter has exactly one right answer.
type searchFixture struct {
	*opsFixture
	ids map[string]int64 // by control id
}

func newSearchFixture(t *testing.T) *searchFixture {
	t.Helper()
	ctx := context.Background()
	f := &searchFixture{opsFixture: emptyOpsFixture(t), ids: map[string]int64{}}
	db, q := f.db, f.q
	// Patients are indexed only under a key.
	f.keys = newKeySpec(t, "k1")
	kr, err := crypt.Parse(f.keys)
	if err != nil {
		t.Fatal(err)
	}
	add := func(control, typ, trigger, patient, hoursAgo string, dests ...string) {
		t.Helper()
		body := fmt.Sprintf("MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||%s^%s|%s|P|2.5\rPID|1||%s^^^HOSP^MR||NAME-OF-%s\r",
			typ, trigger, control, patient, control)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			id, err := pipeline.Receive(ctx, tx, q, pipeline.Inbound{
				Channel: "adt", Source: "test", Raw: []byte(body),
				ControlID: control, MessageType: typ, TriggerEvent: trigger, PatientID: patient, Keys: kr,
			})
			f.ids[control] = id
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE mefor_message SET received_at = clock_timestamp() - $2::interval WHERE id = $1`,
				id, hoursAgo+" hours")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(dests) == 0 {
			return
		}
		rows, err := pipeline.PendingRows(ctx, db.Pool, jobs.IngressLane("adt"), 100)
		if err != nil {
			t.Fatal(err)
		}
		row := rows[len(rows)-1]
		err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return pipeline.RouteHandoff(ctx, tx, q, row, []pipeline.RoutedOut{{Route: "all", Handler: "pass"}})
		})
		if err != nil {
			t.Fatal(err)
		}
		rows, err = pipeline.PendingRows(ctx, db.Pool, jobs.RoutedLane("adt"), 100)
		if err != nil {
			t.Fatal(err)
		}
		var outs []pipeline.OutboundOut
		for _, d := range dests {
			outs = append(outs, pipeline.OutboundOut{Destination: d, Lane: jobs.OutboundLane(d, 0, 1, 0),
				Payload: []byte(strings.Replace(body, "NAME-OF-", "SENT-TO-"+d+"-", 1))})
		}
		err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return pipeline.TransformHandoff(ctx, tx, q, rows[len(rows)-1], outs)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	add("OLD1", "ADT", "A01", "P100", "72", "lab")
	add("A08X", "ADT", "A08", "P200", "30", "lab", "billing")
	add("ORU1", "ORU", "R01", "P300", "5", "results")
	add("DUP", "ADT", "A01", "P100", "1")
	add("DUP", "ADT", "A01", "P400", "0.5")
	return f
}

func (f *searchFixture) list(t *testing.T, args ...string) []string {
	t.Helper()
	got := decode[[]search.MessageSummary](t, f.ok(t, append([]string{"messages", "list", "--json"}, args...)...))
	var controls []string
	for _, m := range got {
		controls = append(controls, m.ControlID)
	}
	return controls
}

func TestMessagesListFilters(t *testing.T) {
	t.Parallel()
	f := newSearchFixture(t)
	cases := []struct {
		args []string
		want []string
	}{
		{nil, []string{"DUP", "DUP", "ORU1", "A08X", "OLD1"}},
		{[]string{"--control-id", "A08X"}, []string{"A08X"}},
		{[]string{"--control-id", "DUP"}, []string{"DUP", "DUP"}},
		{[]string{"--control-id", "a08x"}, nil},
		{[]string{"--patient", "P100"}, []string{"DUP", "OLD1"}},
		{[]string{"--patient", "P10"}, nil},
		{[]string{"--type", "ADT"}, []string{"DUP", "DUP", "A08X", "OLD1"}},
		{[]string{"--type", "ADT^A08"}, []string{"A08X"}},
		{[]string{"--type", "ADT^A08^ADT_A01"}, []string{"A08X"}},
		{[]string{"--type", "ORU^R01"}, []string{"ORU1"}},
		{[]string{"--since", "2h"}, []string{"DUP", "DUP"}},
		{[]string{"--since", "2d"}, []string{"DUP", "DUP", "ORU1", "A08X"}},
		{[]string{"--until", "2d"}, []string{"OLD1"}},
		{[]string{"--since", "48h", "--until", "2h"}, []string{"ORU1", "A08X"}},
		{[]string{"--destination", "lab"}, []string{"A08X", "OLD1"}},
		{[]string{"--destination", "billing"}, []string{"A08X"}},
		{[]string{"--destination", "nowhere"}, nil},
		{[]string{"--text", "NAME-OF-ORU1"}, []string{"ORU1"}},
		{[]string{"--text", "name-of-oru1"}, nil},
		{[]string{"--patient", "P100", "--since", "2h"}, []string{"DUP"}},
		{[]string{"--type", "ADT", "--destination", "lab", "--until", "2d"}, []string{"OLD1"}},
		{[]string{"--control-id", "DUP", "--limit", "1"}, []string{"DUP"}},
	}
	for _, c := range cases {
		if got := f.list(t, c.args...); !slices.Equal(got, c.want) {
			t.Errorf("messages list %v = %v, want %v", c.args, got, c.want)
		}
	}

	// A --since in RFC 3339 means the same as the duration.
	var at string
	if err := f.db.Pool.QueryRow(context.Background(),
		`SELECT to_char((clock_timestamp() - interval '2 hours') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if got := f.list(t, "--since", at); !slices.Equal(got, []string{"DUP", "DUP"}) {
		t.Errorf("--since %s = %v, want the two DUP messages", at, got)
	}

	code, _, stderr := f.mefor(t, "messages", "list", "--since", "yesterday")
	if code == 0 || !strings.Contains(stderr, "--since \"yesterday\" is not a time") || !strings.Contains(stderr, "2h") {
		t.Errorf("--since yesterday: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = f.mefor(t, "messages", "list", "--since", "1h", "--until", "2h")
	if code == 0 || !strings.Contains(stderr, "must be before --until") {
		t.Errorf("--since after --until: exit %d, stderr %q", code, stderr)
	}
	if out := f.ok(t, "messages", "list", "--patient", "P100"); strings.Contains(out, "NAME-OF") {
		t.Errorf("messages list printed content:\n%s", out)
	}
}

// `messages show` takes a control id as well as an id; a control id that
// several messages share lists them and asks for an id.
func TestMessagesShowByControlID(t *testing.T) {
	t.Parallel()
	f := newSearchFixture(t)

	out := f.ok(t, "messages", "show", "ORU1")
	if !strings.Contains(out, "Message:") || !strings.Contains(out, strconv.FormatInt(f.ids["ORU1"], 10)) || !strings.Contains(out, "ORU^R01") {
		t.Fatalf("show ORU1:\n%s", out)
	}
	code, stdout, stderr := f.mefor(t, "messages", "show", "DUP")
	if code != 1 || !strings.Contains(stderr, "names several messages") {
		t.Fatalf("show DUP: exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], `2 messages have control id "DUP"`) || !strings.HasPrefix(lines[1], "ID") {
		t.Fatalf("show DUP listing:\n%s", stdout)
	}
	code, _, stderr = f.mefor(t, "messages", "show", "NOPE")
	if code != 1 || !strings.Contains(stderr, "message NOPE not found") {
		t.Fatalf("show NOPE: exit %d, stderr %q", code, stderr)
	}
	// A number is an id first.
	out = f.ok(t, "messages", "show", strconv.FormatInt(f.ids["A08X"], 10))
	if !strings.Contains(out, "A08X") {
		t.Fatalf("show by id:\n%s", out)
	}
}

// `messages show --body` tells the whole story: the body received, then
// per destination the payload as sent and the partner's reply to each
// attempt.
func TestMessagesShowBodyStory(t *testing.T) {
	t.Parallel()
	f := newSearchFixture(t)
	ctx := context.Background()
	id := f.ids["A08X"]
	rows, err := pipeline.PendingRows(ctx, f.db.Pool, "outbound:lab", 10)
	if err != nil {
		t.Fatal(err)
	}
	var lab pipeline.Row
	for _, r := range rows {
		if r.MessageID == id {
			lab = r
		}
	}
	err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		return pipeline.Failed(ctx, tx, lab, pipeline.Attempt{Outcome: "AE", AckCode: "AE", Reply: []byte("MSH|ACK1\rMSA|AE|A08X|busy\r"), Error: "AE: busy"}, 0, false)
	})
	if err != nil {
		t.Fatal(err)
	}
	lab.Attempts = 1
	err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		_, err := pipeline.Delivered(ctx, tx, lab, pipeline.Attempt{Outcome: "delivered", AckCode: "AA", Reply: []byte("MSH|ACK2\rMSA|AA|A08X\r")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	out := f.ok(t, "messages", "show", "A08X", "--body")
	order := []string{
		"Body:", "NAME-OF-A08X",
		"Sent to lab (row", "done, 2 attempts", "SENT-TO-lab-A08X",
		"Reply from lab", "attempt 1 (AE)", "MSA|AE|A08X|busy",
		"Reply from lab", "attempt 2 (delivered)", "MSA|AA|A08X",
		"Sent to billing (row", "pending, 0 attempts", "SENT-TO-billing-A08X",
	}
	rest := out
	for _, want := range order {
		i := strings.Index(rest, want)
		if i < 0 {
			t.Fatalf("show --body lacks %q (in this order: %q):\n%s", want, order, out)
		}
		rest = rest[i+len(want):]
	}

	type shown struct {
		Outbound []struct {
			Destination string  `json:"destination"`
			Status      string  `json:"status"`
			Payload     *string `json:"payload"`
		} `json:"outbound"`
	}
	v := decode[shown](t, f.ok(t, "messages", "show", "A08X", "--body", "--json"))
	if len(v.Outbound) != 2 || v.Outbound[0].Destination != "lab" || v.Outbound[0].Payload == nil ||
		!strings.Contains(*v.Outbound[0].Payload, "SENT-TO-lab-A08X") || v.Outbound[1].Destination != "billing" {
		t.Fatalf("show --body --json outbound = %+v", v.Outbound)
	}
	if v := decode[shown](t, f.ok(t, "messages", "show", "A08X", "--json")); len(v.Outbound) != 0 {
		t.Fatalf("show --json without --body has outbound payloads: %+v", v.Outbound)
	}
	if out := f.ok(t, "messages", "show", "A08X"); strings.Contains(out, "SENT-TO") || strings.Contains(out, "NAME-OF") {
		t.Fatalf("show without --body printed content:\n%s", out)
	}
}
