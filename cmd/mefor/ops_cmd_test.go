package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
)

// opsFixture is a database holding, on channel adt:
//
//	done:   delivered to lab (partner answered AA)
//	dead:   dead-lettered for lab
//	queued: pending for lab
//	fresh:  just received, not routed
type opsFixture struct {
	db                        *testcontainers.DB
	done, dead, queued, fresh int64
}

const fixtureBody = "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|CTRL%d|P|2.5\rPID|1||SECRET-PATIENT\r"

func newOpsFixture(t *testing.T) *opsFixture {
	t.Helper()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	q, err := ops.NewQueue(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	f := &opsFixture{db: db}
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
	code = run(append(args, "--database-url", f.db.URL), &out, &errb)
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
