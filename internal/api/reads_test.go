package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// receive stores a message into channel as a listener would, with the
// patient identifier patient, and returns its id.
func (h *harness) receive(channel, patient string) int64 {
	h.T.Helper()
	q, err := ops.NewQueue(h.DB.Pool, nil)
	if err != nil {
		h.T.Fatal(err)
	}
	ctl := fmt.Sprintf("C-%s-%d", channel, time.Now().UnixNano())
	raw := "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|" + ctl + "|P|2.5\rPID|1||" + patient + "\r"
	var id int64
	err = pgx.BeginFunc(context.Background(), h.DB.Pool, func(tx pgx.Tx) error {
		id, err = pipeline.Receive(context.Background(), tx, q, pipeline.Inbound{Channel: channel, Source: "test", Raw: []byte(raw),
			ControlID: ctl, MessageType: "ADT", TriggerEvent: "A01", PatientID: patient, Keys: h.keys})
		return err
	})
	if err != nil {
		h.T.Fatal(err)
	}
	return id
}

// user adds a user with a channel scope and returns a bearer header of
// a token of theirs.
func (h *harness) user(name, role string, channels ...string) map[string]string {
	h.T.Helper()
	if _, _, err := h.store.AddUser(h.Ctx, identity.NewUser{Name: name, Role: role, Channels: channels, Password: password}); err != nil {
		h.T.Fatal(err)
	}
	_, secret, err := h.store.CreateToken(h.Ctx, name, time.Hour)
	if err != nil {
		h.T.Fatal(err)
	}
	return map[string]string{"Authorization": "Bearer " + secret}
}

// channelsOf lists the channels of a listing's messages, in its order.
func channelsOf(t *testing.T, body map[string]any) []string {
	t.Helper()
	list, ok := body["messages"].([]any)
	if !ok {
		t.Fatalf("no messages in %v", body)
	}
	out := []string{}
	for _, m := range list {
		out = append(out, m.(map[string]any)["channel"].(string))
	}
	return out
}

// A viewer scoped to lab-* lists only lab messages, page by page with
// the scope applied by the query (the newest messages are adt ones, so a
// page filtered after its limit would come back empty), sees only lab
// channels in status, and gets 404 for an adt message's id, exactly as
// for one that does not exist.
func TestScopedViewerSeesOnlyTheirChannels(t *testing.T) {
	h := newHarness(t, api.Config{})
	lab1, lab2, labB := h.receive("lab-a", "P1"), h.receive("lab-a", "P2"), h.receive("lab-b", "P3")
	adt := h.receive("adt", "P4")
	h.receive("adt", "P5")
	h.receive("adt", "P6")
	vic := h.user("vic", identity.RoleViewer, "lab-*")

	status, page, _ := h.call("GET", "/api/v1/messages?limit=2", nil, vic)
	if status != http.StatusOK || !reflect.DeepEqual(channelsOf(t, page), []string{"lab-b", "lab-a"}) || page["next"] == nil {
		t.Fatalf("first page: %d %v", status, page)
	}
	status, page2, _ := h.call("GET", "/api/v1/messages?limit=2&cursor="+url.QueryEscape(page["next"].(string)), nil, vic)
	if status != http.StatusOK || !reflect.DeepEqual(channelsOf(t, page2), []string{"lab-a"}) || page2["next"] != nil {
		t.Fatalf("second page: %d %v", status, page2)
	}
	ids := []any{page["messages"].([]any)[0].(map[string]any)["id"], page["messages"].([]any)[1].(map[string]any)["id"],
		page2["messages"].([]any)[0].(map[string]any)["id"]}
	if fmt.Sprint(ids) != fmt.Sprint([]int64{labB, lab2, lab1}) {
		t.Fatalf("pages hold %v, want %v", ids, []int64{labB, lab2, lab1})
	}
	// With an upper time bound the listing is in receipt order, and so is
	// its cursor.
	until := url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	status, up, _ := h.call("GET", "/api/v1/messages?limit=2&until="+until, nil, vic)
	if status != http.StatusOK || !reflect.DeepEqual(channelsOf(t, up), []string{"lab-b", "lab-a"}) || up["next"] == nil {
		t.Fatalf("first page until: %d %v", status, up)
	}
	status, up2, _ := h.call("GET", "/api/v1/messages?limit=2&until="+until+"&cursor="+url.QueryEscape(up["next"].(string)), nil, vic)
	if status != http.StatusOK || len(channelsOf(t, up2)) != 1 || up2["messages"].([]any)[0].(map[string]any)["id"] != float64(lab1) {
		t.Fatalf("second page until: %d %v", status, up2)
	}
	if status, e, _ := h.call("GET", "/api/v1/messages?cursor=nonsense", nil, vic); status != http.StatusUnprocessableEntity || e["field"] != "cursor" {
		t.Fatalf("a bad cursor: %d %v", status, e)
	}
	if status, body, _ := h.call("GET", "/api/v1/messages?channel=adt", nil, vic); status != http.StatusOK || len(channelsOf(t, body)) != 0 {
		t.Fatalf("adt by name for a lab viewer: %d %v", status, body)
	}
	if status, body, _ := h.call("GET", "/api/v1/messages", nil, h.user("root", identity.RoleViewer)); status != http.StatusOK || len(channelsOf(t, body)) != 6 {
		t.Fatalf("an unscoped viewer: %d %v", status, body)
	}

	status, st, _ := h.call("GET", "/api/v1/status", nil, vic)
	var chans []string
	for _, c := range st["channels"].([]any) {
		chans = append(chans, c.(map[string]any)["channel"].(string))
	}
	if status != http.StatusOK || strings.Join(chans, ",") != "lab-a,lab-b" {
		t.Fatalf("status for a lab viewer: %d, channels %v", status, chans)
	}
	for _, p := range []string{"/api/v1/nodes", "/api/v1/alerts"} {
		if status, body, _ := h.call("GET", p, nil, vic); status != http.StatusOK {
			t.Fatalf("%s: %d %v", p, status, body)
		}
	}

	if status, m, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d", lab1), nil, vic); status != http.StatusOK ||
		m["message"].(map[string]any)["channel"] != "lab-a" || m["events"] == nil || m["work"] == nil {
		t.Fatalf("a lab message: %d %v", status, m)
	}
	// A lab message that is the reply to an adt message's delivery does
	// not name its parent to a lab viewer.
	h.Exec("UPDATE mefor_message SET parent_id = $1, reply_depth = 1 WHERE id = $2", adt, lab2)
	if status, m, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d", lab2), nil, vic); status != http.StatusOK ||
		m["origin"].(map[string]any)["parent"] != nil {
		t.Fatalf("a reply's parent out of scope: %d %v", status, m["origin"])
	}
	if status, m, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d", lab2), nil, h.user("all", identity.RoleViewer)); status != http.StatusOK ||
		m["origin"].(map[string]any)["parent"] == nil {
		t.Fatalf("a reply's parent for an unscoped viewer: %d %v", status, m["origin"])
	}
	status, out, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d", adt), nil, vic)
	_, none, _ := h.call("GET", "/api/v1/messages/999999999", nil, vic)
	if status != http.StatusNotFound || !reflect.DeepEqual(out, none) {
		t.Fatalf("an adt message for a lab viewer: %d %v; a missing one: %v", status, out, none)
	}
	// Content needs its permission, whatever the message.
	for _, id := range []int64{lab1, adt} {
		if status, e, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d/body", id), nil, vic); status != http.StatusForbidden || e["permission"] != "messages.body" {
			t.Fatalf("a viewer reading a body: %d %v", status, e)
		}
	}
}

// An operator's body view answers the content and writes a view-body
// audit row naming the person; a scoped operator gets 404 for another
// channel's body, as for a missing message, and no body is read.
func TestBodyViewIsAuditedWithThePersonAndScoped(t *testing.T) {
	h := newHarness(t, api.Config{})
	lab, adt := h.receive("lab-a", "P1"), h.receive("adt", "P2")
	olga := h.user("olga", identity.RoleOperator, "lab-*")

	status, b, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d/body", lab), nil, olga)
	if raw, _ := b["raw"].(string); status != http.StatusOK || !strings.HasPrefix(raw, "MSH|") || !strings.Contains(raw, "PID|1||P1") {
		t.Fatalf("body: %d %v", status, b)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'view-body' AND target::jsonb->>'actor' = 'olga'
		AND (target::jsonb->>'message_id')::bigint = $1`, lab); n != 1 {
		t.Fatalf("view-body rows naming olga: %d, want 1", n)
	}
	status, out, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d/body", adt), nil, olga)
	_, none, _ := h.call("GET", "/api/v1/messages/999999999/body", nil, olga)
	if status != http.StatusNotFound || !reflect.DeepEqual(out, none) {
		t.Fatalf("an adt body for a lab operator: %d %v; a missing one: %v", status, out, none)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'view-body' AND outcome = 'ok'
		AND (target::jsonb->>'message_id')::bigint = $1`, adt); n != 0 {
		t.Fatalf("the adt body was read for a lab operator: %d view-body rows", n)
	}
}

// A patient identifier in a URL is refused, naming the field; the search
// by patient goes in a POST body, needs the content permission, is
// scoped, and is audited naming the person.
func TestPatientSearchOnlyInABody(t *testing.T) {
	// Patients are indexed under a key (blind indexes).
	kr := fixtures.Keyring(t, "t")
	h := newKeyedHarness(t, api.Config{}, kr)
	lab := h.receive("lab-a", "P77")
	h.receive("adt", "P77")
	olga := h.user("olga", identity.RoleOperator, "lab-*")
	vic := h.user("vic", identity.RoleViewer)

	if status, e, _ := h.call("GET", "/api/v1/messages?patient=P77", nil, olga); status != http.StatusUnprocessableEntity || e["field"] != "patient" {
		t.Fatalf("a patient in the query string: %d %v", status, e)
	}
	if status, e, _ := h.call("POST", "/api/v1/messages/search", map[string]any{"patient": "P77"}, vic); status != http.StatusForbidden || e["permission"] != "messages.body" {
		t.Fatalf("a viewer searching by patient: %d %v", status, e)
	}
	status, body, _ := h.call("POST", "/api/v1/messages/search", map[string]any{"patient": "P77"}, olga)
	list, _ := body["messages"].([]any)
	if status != http.StatusOK || len(list) != 1 || list[0].(map[string]any)["id"] != float64(lab) {
		t.Fatalf("a lab operator's patient search: %d %v", status, body)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'search-patient' AND target::jsonb->>'actor' = 'olga'`); n != 1 {
		t.Fatalf("search-patient rows naming olga: %d, want 1", n)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE target LIKE '%P77%'`); n != 0 {
		t.Fatalf("the patient identifier is in %d audit rows", n)
	}
	if status, e, _ := h.call("GET", "/api/v1/messages?text=x", nil, olga); status != http.StatusUnprocessableEntity || e["field"] != "text" {
		t.Fatalf("a text in the query string: %d %v", status, e)
	}
	// A text search goes in the body too: content, so the content
	// permission, scoped, and audited naming the person.
	if status, e, _ := h.call("POST", "/api/v1/messages/search", map[string]any{"text": "P77"}, vic); status != http.StatusForbidden || e["permission"] != "messages.body" {
		t.Fatalf("a viewer searching bodies: %d %v", status, e)
	}
	status, body, _ = h.call("POST", "/api/v1/messages/search", map[string]any{"text": "P77"}, olga)
	list, _ = body["messages"].([]any)
	if status != http.StatusOK || len(list) != 1 || list[0].(map[string]any)["id"] != float64(lab) {
		t.Fatalf("a lab operator's text search: %d %v", status, body)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'search-bodies' AND target::jsonb->>'actor' = 'olga'`); n != 1 {
		t.Fatalf("search-bodies rows naming olga: %d, want 1", n)
	}
}

// A node without encryption keys indexes no patient: a search by patient
// is a 422 naming the field, saying why, not a server error.
func TestPatientSearchWithoutKeysIsRefusedClearly(t *testing.T) {
	h := newHarness(t, api.Config{})
	h.receive("lab-a", "P77")
	olga := h.user("olga", identity.RoleOperator)
	status, e, _ := h.call("POST", "/api/v1/messages/search", map[string]any{"patient": "P77"}, olga)
	if status != http.StatusUnprocessableEntity || e["field"] != "patient" || !strings.Contains(fmt.Sprint(e["error"]), "encryption keys") {
		t.Fatalf("a patient search on a node without keys: %d %v", status, e)
	}
}

// kill dead-letters msg's ingress row, as a drainer does past
// max_attempts.
func (h *harness) kill(channel string, msg int64) {
	h.T.Helper()
	rows, err := pipeline.PendingRows(h.Ctx, h.DB.Pool, jobs.IngressLane(channel), 1000)
	if err != nil {
		h.T.Fatal(err)
	}
	for _, row := range rows {
		if row.MessageID == msg {
			if err := pgx.BeginFunc(h.Ctx, h.DB.Pool, func(tx pgx.Tx) error {
				return pipeline.Failed(h.Ctx, tx, row, pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: "rejected"}, 0, true)
			}); err != nil {
				h.T.Fatal(err)
			}
			return
		}
	}
	h.T.Fatalf("message %d has no pending ingress row", msg)
}

// A viewer scoped to lab-* lists only lab dead letters, newest adt ones
// left out by the query (a limit of 1 still finds the lab one); the audit
// log is refused to a scoped user and shown to an unscoped admin, naming
// the people who acted.
func TestDeadAndAuditScoped(t *testing.T) {
	h := newHarness(t, api.Config{})
	lab := h.receive("lab-a", "P1")
	adt := h.receive("adt", "P2")
	h.kill("lab-a", lab)
	h.kill("adt", adt)
	vic := h.user("vic", identity.RoleViewer, "lab-*")

	status, body, _ := h.call("GET", "/api/v1/dead?limit=1", nil, vic)
	dead, _ := body["dead"].([]any)
	if status != http.StatusOK || len(dead) != 1 || dead[0].(map[string]any)["message_id"] != float64(lab) {
		t.Fatalf("dead letters for a lab viewer: %d %v", status, body)
	}
	if status, body, _ := h.call("GET", "/api/v1/dead", nil, h.user("all", identity.RoleViewer)); status != http.StatusOK || len(body["dead"].([]any)) != 2 {
		t.Fatalf("dead letters for an unscoped viewer: %d %v", status, body)
	}

	if status, e, _ := h.call("GET", "/api/v1/audit", nil, vic); status != http.StatusForbidden || e["permission"] != "audit.read" {
		t.Fatalf("a viewer reading the audit log: %d %v", status, e)
	}
	// Admins need MFA to log in, not to use a token.
	h.user("root", identity.RoleAdmin)
	_, rootSecret, err := h.store.CreateToken(h.Ctx, "root", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	olga := h.user("olga", identity.RoleOperator)
	if status, b, _ := h.call("GET", fmt.Sprintf("/api/v1/messages/%d/body", lab), nil, olga); status != http.StatusOK {
		t.Fatalf("body: %d %v", status, b)
	}
	status, body, _ = h.call("GET", "/api/v1/audit?action=view-body", nil, map[string]string{"Authorization": "Bearer " + rootSecret})
	rows, _ := body["audit"].([]any)
	if status != http.StatusOK || len(rows) == 0 || rows[0].(map[string]any)["actor"] != "olga" {
		t.Fatalf("the audit log for an admin: %d %v", status, body)
	}
	labAdmin := h.user("labadmin", identity.RoleAdmin, "lab-*")
	if status, e, _ := h.call("GET", "/api/v1/audit", nil, labAdmin); status != http.StatusForbidden || e["permission"] != "audit.read" {
		t.Fatalf("a scoped admin reading the audit log: %d %v", status, e)
	}
}

// A person scoped to lab-* sees the alerts of rules on their channels
// only: not another channel's, not a destination's (whose queue mixes
// channels, as in the status), and not a rule the node does not know. An
// unscoped viewer sees them all.
func TestAlertsScoped(t *testing.T) {
	watches := map[string]string{"lab-stuck": "lab-a", "adt-stuck": "adt", "out-stuck": ""}
	h := newHarness(t, api.Config{AlertChannel: func(rule string) (string, bool) {
		ch, ok := watches[rule]
		return ch, ok
	}})
	for _, rule := range []string{"lab-stuck", "adt-stuck", "out-stuck", "gone"} {
		fixtures.Exec(t, h.DB, `INSERT INTO mefor_alert (rule, state) VALUES ($1, 'firing')`, rule)
	}
	rules := func(who map[string]string) []string {
		t.Helper()
		status, body, _ := h.call("GET", "/api/v1/alerts", nil, who)
		if status != http.StatusOK {
			t.Fatalf("alerts: %d %v", status, body)
		}
		var out []string
		for _, a := range body["alerts"].([]any) {
			out = append(out, a.(map[string]any)["rule"].(string))
		}
		slices.Sort(out)
		return out
	}
	if got := rules(h.user("lena", identity.RoleViewer, "lab-*")); !slices.Equal(got, []string{"lab-stuck"}) {
		t.Errorf("a lab-scoped viewer sees alerts %v, want only lab-stuck", got)
	}
	if got := rules(h.user("vic", identity.RoleViewer)); len(got) != 4 {
		t.Errorf("an unscoped viewer sees alerts %v, want all four", got)
	}
}
