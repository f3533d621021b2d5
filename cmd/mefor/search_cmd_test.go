package main

import (
	"context"
	"fmt"
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

// searchFixture holds messages that differ in one searchable property
// each, so every filter has exactly one right answer.
type searchFixture struct {
	*opsFixture
	ids map[string]int64 // by control id
}

func newSearchFixture(t *testing.T) *searchFixture {
	t.Helper()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	q, err := ops.NewQueue(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &searchFixture{opsFixture: &opsFixture{db: db}, ids: map[string]int64{}}
	add := func(control, typ, trigger, patient, hoursAgo string, dests ...string) {
		t.Helper()
		body := fmt.Sprintf("MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||%s^%s|%s|P|2.5\rPID|1||%s^^^HOSP^MR||NAME-OF-%s\r",
			typ, trigger, control, patient, control)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			id, err := pipeline.Receive(ctx, tx, q, pipeline.Inbound{
				Channel: "adt", Source: "test", Raw: []byte(body),
				ControlID: control, MessageType: typ, TriggerEvent: trigger, PatientID: patient,
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
