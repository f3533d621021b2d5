package api_test

import (
	"fmt"
	"net/http"
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

// pending is msg's pending row in lane.
func (h *harness) pending(lane string, msg int64) pipeline.Row {
	h.T.Helper()
	return fixtures.PendingRow(h.T, h.DB, lane, msg)
}

func (h *harness) tx(fn func(tx pgx.Tx) error) {
	h.T.Helper()
	if err := pgx.BeginFunc(h.Ctx, h.DB.Pool, fn); err != nil {
		h.T.Fatal(err)
	}
}

// toDestination receives a message into channel and hands it on, through
// the real hand-offs, to a pending delivery to destination (lane
// outbound:destination); dead dead-letters that delivery.
func (h *harness) toDestination(channel, destination string, dead bool) int64 {
	h.T.Helper()
	q, err := ops.NewQueue(h.DB.Pool, nil)
	if err != nil {
		h.T.Fatal(err)
	}
	id := h.receive(channel, "P-"+channel)
	row := h.pending(jobs.IngressLane(channel), id)
	h.tx(func(tx pgx.Tx) error {
		return pipeline.RouteHandoff(h.Ctx, tx, q, row, []pipeline.RoutedOut{{Route: "r", Handler: "h"}})
	})
	row = h.pending(jobs.RoutedLane(channel), id)
	lane := "outbound:" + destination
	h.tx(func(tx pgx.Tx) error {
		return pipeline.TransformHandoff(h.Ctx, tx, q, row, []pipeline.OutboundOut{{Destination: destination, Lane: lane, Payload: []byte("MSH|out")}})
	})
	if dead {
		row = h.pending(lane, id)
		h.tx(func(tx pgx.Tx) error {
			return pipeline.Failed(h.Ctx, tx, row, pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: "partner rejected"}, 0, true)
		})
	}
	return id
}

// outboundStatus is the status of msg's delivery.
func (h *harness) outboundStatus(msg int64) string {
	h.T.Helper()
	var s string
	if err := h.DB.Pool.QueryRow(h.Ctx, `SELECT status FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'`, msg).Scan(&s); err != nil {
		h.T.Fatal(err)
	}
	return s
}

// login logs name in over the API and returns the session cookie and its
// CSRF header.
func (h *harness) login(name, secret string) (*http.Cookie, map[string]string) {
	h.T.Helper()
	code, _ := identity.TOTPCode(secret, h.clock.Now())
	status, body, resp := h.call("POST", "/api/v1/login", map[string]string{"username": name, "password": password, "totp": code}, nil)
	if status != http.StatusOK {
		h.T.Fatalf("login %s: %d %v", name, status, body)
	}
	return sessionCookie(h.T, resp), map[string]string{api.CSRFHeader: body["csrf_token"].(string)}
}

// A viewer's replay is refused with 403 naming the permission it lacks,
// and nothing is replayed.
func TestViewerReplayIsRefusedNamingThePermission(t *testing.T) {
	h := newHarness(t, api.Config{})
	msg := h.toDestination("lab-a", "lab", true)
	vic := h.user("vic", identity.RoleViewer)
	status, e, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", msg), nil, vic)
	if status != http.StatusForbidden || e["permission"] != "replay" {
		t.Fatalf("a viewer's replay: %d %v", status, e)
	}
	if got := h.outboundStatus(msg); got != "dead" {
		t.Fatalf("the refused replay left the delivery %s", got)
	}
	if status, e, _ := h.call("POST", "/api/v1/dead/replay", map[string]any{"destination": "lab"}, vic); status != http.StatusForbidden || e["permission"] != "replay-dead" {
		t.Fatalf("a viewer's replay-dead: %d %v", status, e)
	}
}

// A user scoped to lab-* replays a lab message, and gets for an adt
// message the 404 a message that does not exist gets, leaving it dead.
func TestScopedReplayOfAnotherChannelIsNotFound(t *testing.T) {
	h := newHarness(t, api.Config{})
	lab := h.toDestination("lab-a", "out", true)
	adt := h.toDestination("adt", "out", true)
	olga := h.user("olga", identity.RoleOperator, "lab-*")

	status, other, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", adt), nil, olga)
	_, none, _ := h.call("POST", "/api/v1/messages/999999/replay", nil, olga)
	if status != http.StatusNotFound || fmt.Sprint(other) != fmt.Sprint(none) {
		t.Fatalf("replay of another channel's message: %d %v; of none: %v", status, other, none)
	}
	if got := h.outboundStatus(adt); got != "dead" {
		t.Fatalf("the adt delivery is %s after a lab user's replay", got)
	}
	status, res, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", lab), nil, olga)
	if status != http.StatusOK || res["rows"] != float64(1) {
		t.Fatalf("replay of a lab message: %d %v", status, res)
	}
	if got := h.outboundStatus(lab); got != "pending" {
		t.Fatalf("the replayed lab delivery is %s", got)
	}
}

// replay-dead and cancel of a destination that lab-a and adt share touch,
// for a user scoped to lab-*, only lab-a's rows; an unscoped user's touch
// both.
func TestReplayDeadAndCancelTouchOnlyTheScopedChannels(t *testing.T) {
	h := newHarness(t, api.Config{})
	deadLab, deadADT := h.toDestination("lab-a", "shared", true), h.toDestination("adt", "shared", true)
	olga := h.user("olga", identity.RoleOperator, "lab-*")

	status, res, _ := h.call("POST", "/api/v1/dead/replay", map[string]any{"destination": "shared"}, olga)
	if status != http.StatusOK || res["rows"] != float64(1) {
		t.Fatalf("a lab user's replay-dead: %d %v", status, res)
	}
	if lab, adt := h.outboundStatus(deadLab), h.outboundStatus(deadADT); lab != "pending" || adt != "dead" {
		t.Fatalf("after a lab user's replay-dead: lab-a %s, adt %s; want pending, dead", lab, adt)
	}
	// Naming the other channel does not reach it either.
	if status, res, _ := h.call("POST", "/api/v1/dead/replay", map[string]any{"channel": "adt", "destination": "shared"}, olga); status != http.StatusOK ||
		res["rows"] != float64(0) || h.outboundStatus(deadADT) != "dead" {
		t.Fatalf("a lab user's replay-dead of adt: %d %v", status, res)
	}

	// Both deliveries pending now (deadADT by the unscoped user's replay).
	all := h.user("root", identity.RoleOperator)
	if status, res, _ := h.call("POST", "/api/v1/dead/replay", map[string]any{"destination": "shared"}, all); status != http.StatusOK || res["rows"] != float64(1) {
		t.Fatalf("an unscoped replay-dead: %d %v", status, res)
	}
	status, res, _ = h.call("POST", "/api/v1/destinations/shared/cancel", map[string]any{}, olga)
	if status != http.StatusOK || res["rows"] != float64(1) {
		t.Fatalf("a lab user's cancel: %d %v", status, res)
	}
	if lab, adt := h.outboundStatus(deadLab), h.outboundStatus(deadADT); lab != "cancelled" || adt != "pending" {
		t.Fatalf("after a lab user's cancel: lab-a %s, adt %s; want cancelled, pending", lab, adt)
	}
	if status, e, _ := h.call("POST", "/api/v1/destinations/shared/cancel", map[string]any{"top": "yes"}, olga); status != http.StatusUnprocessableEntity || e["field"] != "top" {
		t.Fatalf("a cancel with a bad top: %d %v", status, e)
	}
}

// An action's audit row names the person (actor), their address and the
// token they came with; GET /api/v1/audit shows the actor.
func TestActionIsAuditedWithItsActor(t *testing.T) {
	h := newHarness(t, api.Config{})
	msg := h.toDestination("lab-a", "out", true)
	h.add("olga", identity.RoleOperator)
	tok, secret, err := h.store.CreateToken(h.Ctx, "olga", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, res, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", msg), nil, map[string]string{"Authorization": "Bearer " + secret}); status != http.StatusOK {
		t.Fatalf("replay: %d %v", status, res)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'replay' AND outcome = 'ok'
		AND target::jsonb @> jsonb_build_object('actor', 'olga', 'source', '127.0.0.1', 'token_id', $1::bigint, 'message_id', $2::bigint)`, tok.ID, msg); n != 1 {
		t.Fatalf("%d replay rows naming olga, her address and token", n)
	}
	root := h.user("root", identity.RoleAdmin)
	status, body, _ := h.call("GET", "/api/v1/audit?action=replay", nil, root)
	rows, _ := body["audit"].([]any)
	if status != http.StatusOK || len(rows) != 1 || rows[0].(map[string]any)["actor"] != "olga" {
		t.Fatalf("the audit log: %d %v", status, body)
	}
}

// A write authenticated by the session cookie needs the CSRF header: an
// action without it is refused and runs nothing.
func TestCookieActionNeedsCSRF(t *testing.T) {
	h := newHarness(t, api.Config{})
	msg := h.toDestination("lab-a", "out", true)
	secret := h.add("alice", identity.RoleAdmin)
	cookie, csrf := h.login("alice", secret)
	path := fmt.Sprintf("/api/v1/messages/%d/replay", msg)
	if status, e, _ := h.call("POST", path, nil, nil, cookie); status != http.StatusForbidden || e["permission"] != "csrf" {
		t.Fatalf("a replay by cookie without the CSRF header: %d %v", status, e)
	}
	if got := h.outboundStatus(msg); got != "dead" {
		t.Fatalf("the refused replay left the delivery %s", got)
	}
	if status, res, _ := h.call("POST", path, nil, csrf, cookie); status != http.StatusOK || res["rows"] != float64(1) {
		t.Fatalf("a replay by cookie with the CSRF header: %d %v", status, res)
	}
}

// Stepdown needs a password and TOTP check within the last 5 minutes:
// refused before it, allowed after it, refused again once the window
// passed (the store's clock is moved, not waited for), and always refused
// to an API token, which cannot re-authenticate.
func TestStepdownNeedsAFreshReauthentication(t *testing.T) {
	h := newHarness(t, api.Config{})
	secret := h.add("alice", identity.RoleAdmin)
	cookie, csrf := h.login("alice", secret)
	stepdown := func() (int, map[string]any) {
		status, body, _ := h.call("POST", "/api/v1/cluster/stepdown", map[string]any{}, csrf, cookie)
		return status, body
	}
	if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" || !strings.Contains(fmt.Sprint(e["error"]), "/api/v1/reauth") {
		t.Fatalf("stepdown without a re-authentication: %d %v", status, e)
	}
	// The login's code is used up; the next step's is not.
	h.clock.Advance(30 * time.Second)
	code, _ := identity.TOTPCode(secret, h.clock.Now())
	if status, e, _ := h.call("POST", "/api/v1/reauth", map[string]string{"password": "wrong password!", "totp": code}, csrf, cookie); status != http.StatusUnauthorized {
		t.Fatalf("a re-authentication with a wrong password: %d %v", status, e)
	}
	if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" {
		t.Fatalf("stepdown after a failed re-authentication: %d %v", status, e)
	}
	if status, e, _ := h.call("POST", "/api/v1/reauth", map[string]string{"password": password, "totp": code}, csrf, cookie); status != http.StatusOK {
		t.Fatalf("re-authentication: %d %v", status, e)
	}
	if status, body := stepdown(); status != http.StatusOK || body["outcome"] != ops.OutcomeNoHolder {
		t.Fatalf("stepdown within the window: %d %v", status, body)
	}
	h.clock.Advance(identity.ReauthWindow + time.Second)
	if status, e := stepdown(); status != http.StatusForbidden || e["permission"] != "reauth" {
		t.Fatalf("stepdown past the window: %d %v", status, e)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'reauth' AND target::jsonb->>'actor' = 'alice'`); n != 2 {
		t.Errorf("%d reauth rows naming alice, want the failed one and the good one", n)
	}

	root := h.user("root", identity.RoleAdmin)
	if status, e, _ := h.call("POST", "/api/v1/cluster/stepdown", map[string]any{}, root); status != http.StatusForbidden || e["permission"] != "reauth" {
		t.Fatalf("stepdown by an API token: %d %v", status, e)
	}
}

// A cancel's wait and a stepdown's timeout are bounded: the answer must come
// within the server's write timeout, so more than MaxActionWait is a 422
// naming the field, and nothing is cancelled.
func TestActionWaitsAreBounded(t *testing.T) {
	h := newHarness(t, api.Config{})
	msg := h.toDestination("lab-a", "lab", false)
	olga := h.user("olga", identity.RoleOperator)
	ada := h.user("ada", identity.RoleAdmin)
	status, e, _ := h.call("POST", "/api/v1/destinations/lab/cancel", map[string]any{"wait": "2m"}, olga)
	if status != http.StatusUnprocessableEntity || e["field"] != "wait" {
		t.Fatalf("a cancel waiting 2m: %d %v; want 422 naming wait", status, e)
	}
	if got := h.outboundStatus(msg); got != "pending" {
		t.Fatalf("the refused cancel left the delivery %s", got)
	}
	status, e, _ = h.call("POST", "/api/v1/cluster/stepdown", map[string]any{"timeout": "forever"}, ada)
	if status != http.StatusUnprocessableEntity || e["field"] != "timeout" {
		t.Fatalf("a stepdown with timeout forever: %d %v; want 422 naming timeout", status, e)
	}
	status, e, _ = h.call("POST", "/api/v1/destinations/lab/cancel", map[string]any{"wait": "0s"}, olga)
	if status != http.StatusOK || e["rows"] != float64(1) {
		t.Fatalf("a cancel not waiting: %d %v; want 200 with the row cancelled", status, e)
	}
}
