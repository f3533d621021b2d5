package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/migrations"
)

// An operator login cannot rewrite content with its own statements: the
// database refuses its UPDATE of a queued delivery's payload (another
// patient's copied onto it), of a stored body, of a row's lane or
// destination, and its INSERT of a delivery carrying a payload, and the
// delivery still holds what it held. Nor can it re-queue or cancel a row
// without mefor (which would leave no audit row), or add a drainer job.
// What an operator's commands change still works as that login, through
// the database functions: replay, cancel and enqueue, each audited under
// its name.
func TestOperatorCannotRewriteContent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newOpsFixture(t)
	f.ok(t, "migrate")
	opName, operator := newLogin(t, f.db, migrations.RoleOperator)

	var queuedRow, doneRow int64
	var before []byte
	if err := f.db.Pool.QueryRow(ctx, `SELECT id, payload FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'`,
		f.queued).Scan(&queuedRow, &before); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Pool.QueryRow(ctx, `SELECT id FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'`,
		f.done).Scan(&doneRow); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, operator)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	refused := []struct {
		what, sql string
		args      []any
	}{
		{"copy another delivery's payload onto a queued one",
			`UPDATE mefor_work SET payload = (SELECT payload FROM mefor_work WHERE id = $2) WHERE id = $1`, []any{queuedRow, doneRow}},
		{"rewrite a stored body", `UPDATE mefor_message SET raw = 'MSH|forged' WHERE id = $1`, []any{f.queued}},
		{"move a delivery to another destination", `UPDATE mefor_work SET destination = 'elsewhere', lane = 'outbound:elsewhere' WHERE id = $1`, []any{queuedRow}},
		{"move a delivery to another message", `UPDATE mefor_work SET message_id = $2 WHERE id = $1`, []any{queuedRow, f.done}},
		{"insert a delivery with a payload",
			`INSERT INTO mefor_work (message_id, stage, lane, channel, destination, payload) VALUES ($1, 'outbound', 'outbound:lab', 'adt', 'lab', 'MSH|forged')`,
			[]any{f.done}},
		{"re-queue a delivery without the audit row", `UPDATE mefor_work SET status = 'pending', seq = nextval('mefor_work_seq') WHERE id = $1`, []any{doneRow}},
		{"cancel a delivery without the audit row", `UPDATE mefor_work SET status = 'cancelled' WHERE id = $1`, []any{queuedRow}},
		{"insert a second drainer job", `INSERT INTO river_job (args, kind, max_attempts, queue) VALUES ('{"lane": "outbound:lab"}', 'mefor_outbound', 25, 'mefor_outbound')`, nil},
	}
	for _, r := range refused {
		if _, err := conn.Exec(ctx, r.sql, r.args...); !migrations.IsPermissionDenied(err) {
			t.Errorf("operator: %s: %v; want permission denied", r.what, err)
		}
	}
	var after []byte
	if err := f.db.Pool.QueryRow(ctx, `SELECT payload FROM mefor_work WHERE id = $1`, queuedRow).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after, before) {
		t.Errorf("the queued delivery's payload changed under the operator's statements")
	}

	id := strconv.FormatInt
	for _, args := range [][]string{
		{"replay", id(f.dead, 10)},
		{"cancel", "--destination", "lab", "--wait", "0"},
	} {
		if code, out, errs := as(t, operator, args...); code != 0 {
			t.Errorf("operator: mefor %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	msg := filepath.Join(t.TempDir(), "adt.hl7")
	if err := os.WriteFile(msg, []byte(strings.Replace(fixtureBody, "%d", "99", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := as(t, operator, "enqueue", "--channel", "adt", msg); code != 0 {
		t.Errorf("operator: enqueue: exit %d\n%s%s", code, out, errs)
	}
	done := map[string]bool{}
	for _, r := range f.auditRows(t, "--limit", "1000") {
		if r.DBRole == opName && r.Outcome == "ok" {
			done[r.Action] = true
		}
	}
	for _, a := range []string{"replay", "cancel", "enqueue"} {
		if !done[a] {
			t.Errorf("no audit row of the operator's %s (rows ok: %v)", a, done)
		}
	}
}

// An operator reads message bodies, partner replies and delivery payloads
// only through mefor: its own SELECT of them, or a search of the bodies in
// SQL, is refused, while `messages show --body` and `messages list --text`
// as that login show the body and reply and find the message, and record
// view-body and search-bodies rows under its name naming that message,
// written by the functions that read the bodies.
func TestOperatorReadsBodiesOnlyThroughMefor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newOpsFixture(t)
	f.ok(t, "migrate")
	opName, operator := newLogin(t, f.db, migrations.RoleOperator)
	conn, err := pgx.Connect(ctx, operator)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for _, sql := range []string{
		`SELECT raw FROM mefor_message WHERE id = $1`,
		`SELECT id FROM mefor_message WHERE id = $1 AND position('SECRET' IN raw) > 0`,
		`SELECT body FROM mefor_response WHERE message_id = $1`,
		`SELECT payload FROM mefor_work WHERE message_id = $1`,
		`SELECT * FROM mefor_response WHERE message_id = $1`,
	} {
		rows, err := conn.Query(ctx, sql, f.done)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
			err = rows.Err()
		}
		if !migrations.IsPermissionDenied(err) {
			t.Errorf("operator: %s: %v; want permission denied", sql, err)
		}
	}

	code, out, errs := as(t, operator, "messages", "show", strconv.FormatInt(f.done, 10), "--body", "--json")
	if code != 0 {
		t.Fatalf("operator: messages show --body: exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "SECRET-PATIENT") || !strings.Contains(out, `MSA|AA`) {
		t.Errorf("operator's show --body lacks the body or the partner's reply:\n%s", out)
	}
	code, out, errs = as(t, operator, "messages", "list", "--text", "SECRET-PATIENT", "--json")
	if code != 0 || !strings.Contains(out, `"id": `+strconv.FormatInt(f.done, 10)) {
		t.Errorf("operator: messages list --text: exit %d, want message %d found\n%s%s", code, f.done, out, errs)
	}
	found, searched := false, false
	for _, r := range f.auditRows(t, "--limit", "1000") {
		var read struct {
			BodiesRead []int64 `json:"bodies_read"`
		}
		_ = json.Unmarshal(r.Target, &read)
		if r.DBRole == opName && r.Action == "search-bodies" && slices.Contains(read.BodiesRead, f.done) {
			searched = true
		}
		var target struct {
			MessageID int64 `json:"message_id"`
		}
		_ = json.Unmarshal(r.Target, &target)
		if r.DBRole == opName && r.Action == "view-body" && r.Outcome == "ok" && target.MessageID == f.done {
			found = true
		}
	}
	if !found {
		t.Errorf("no view-body row of the operator for message %d", f.done)
	}
	if !searched {
		t.Errorf("no search-bodies row of the operator naming the body of message %d it read", f.done)
	}
}
