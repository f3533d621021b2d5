package api_test

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/identity"
)

// dualControl is a harness whose replay and replay-dead need a second
// person.
func dualControl(t *testing.T) *harness {
	return newHarness(t, api.Config{Approvals: api.Approvals{RequiredFor: []identity.Permission{identity.PermReplay, identity.PermReplayDead}}})
}

// approvalID is the approval_id of a 202 answer.
func approvalID(t *testing.T, status int, body map[string]any) int64 {
	t.Helper()
	id, ok := body["approval_id"].(float64)
	if status != http.StatusAccepted || !ok || body["state"] != "pending" {
		t.Fatalf("want 202 with an approval_id: %d %v", status, body)
	}
	return int64(id)
}

// The requester cannot approve their own request: it is refused (403,
// "dual-control") and nothing runs; another operator's approval runs it,
// and every row names both people.
func TestSelfApprovalIsRefused(t *testing.T) {
	h := dualControl(t)
	msg := h.toDestination("lab-a", "lab", true)
	alice, bob := h.user("alice", identity.RoleOperator), h.user("bob", identity.RoleOperator)

	status, body, _ := h.call("POST", "/api/v1/dead/replay", map[string]any{"destination": "lab"}, alice)
	id := approvalID(t, status, body)
	if got := h.outboundStatus(msg); got != "dead" {
		t.Fatalf("the request ran before its approval: the delivery is %s", got)
	}
	status, e, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil, alice)
	if status != http.StatusForbidden || e["permission"] != "dual-control" {
		t.Fatalf("alice approving her own request: %d %v", status, e)
	}
	if got := h.outboundStatus(msg); got != "dead" {
		t.Fatalf("the self-approval ran the action: the delivery is %s", got)
	}
	status, res, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil, bob)
	if status != http.StatusOK || res["result"].(map[string]any)["rows"] != float64(1) || res["approval"].(map[string]any)["state"] != "done" {
		t.Fatalf("bob's approval: %d %v", status, res)
	}
	if got := h.outboundStatus(msg); got != "pending" {
		t.Fatalf("after bob's approval the delivery is %s", got)
	}
	for _, c := range []struct {
		action, outcome, actor string
		n                      int64
	}{
		{"approval-request", "requested", "alice", 1},
		{"approval-approve", "denied", "alice", 1},
		{"approval-approve", "ok", "bob", 1},
		{"replay-dead", "ok", "bob", 1},
	} {
		sql := `SELECT count(*) FROM mefor_audit WHERE action = $1 AND outcome = $2 AND target::jsonb->>'actor' = $3 AND (target::jsonb->>'approval_id')::bigint = $4`
		if c.action != "approval-request" {
			sql += ` AND target::jsonb->>'requested_by' = 'alice'`
		}
		if n := h.Int(sql, c.action, c.outcome, c.actor, id); n != c.n {
			t.Errorf("%d %s rows (%s) by %s for approval %d, want %d", n, c.action, c.outcome, c.actor, id, c.n)
		}
	}
	// alice's list shows it done, naming both.
	status, list, _ := h.call("GET", "/api/v1/approvals", nil, alice)
	items, _ := list["approvals"].([]any)
	if status != http.StatusOK || len(items) != 1 || items[0].(map[string]any)["decided_by"] != "bob" || items[0].(map[string]any)["requested_by"] != "alice" {
		t.Fatalf("the approval list: %d %v", status, list)
	}
	if status, e, _ := h.call("GET", "/api/v1/approvals", nil, h.user("vic", identity.RoleViewer)); status != http.StatusForbidden {
		t.Fatalf("a viewer listing approvals: %d %v", status, e)
	}
}

// Two approvers racing on one request: one runs it, the other is told it
// was decided, and the message is replayed once.
func TestApprovedActionRunsOnce(t *testing.T) {
	h := dualControl(t)
	msg := h.toDestination("lab-a", "lab", true)
	alice := h.user("alice", identity.RoleOperator)
	approvers := []map[string]string{h.user("bob", identity.RoleOperator), h.user("carol", identity.RoleOperator)}

	status, body, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", msg), nil, alice)
	id := approvalID(t, status, body)
	var (
		wg       sync.WaitGroup
		statuses = make([]int, len(approvers))
	)
	start := make(chan struct{})
	for i, who := range approvers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			statuses[i], _, _ = h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil, who)
		}()
	}
	close(start)
	wg.Wait()
	sort.Ints(statuses)
	if statuses[0] != http.StatusOK || statuses[1] != http.StatusConflict {
		t.Fatalf("two approvals answered %v, want one 200 and one 409", statuses)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'replay' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("the message was replayed %d times", n)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_event WHERE message_id = $1 AND event = 'replayed'`, msg); n != 1 {
		t.Fatalf("%d replayed events", n)
	}
}

// A request past access.approvals.expire cannot be approved: 409 saying
// expired, and nothing runs.
func TestExpiredApprovalIsRefused(t *testing.T) {
	h := dualControl(t)
	msg := h.toDestination("lab-a", "lab", true)
	alice, bob := h.user("alice", identity.RoleOperator), h.user("bob", identity.RoleOperator)
	status, body, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", msg), nil, alice)
	id := approvalID(t, status, body)

	h.clock.Advance(24*time.Hour + time.Second)
	status, e, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil, bob)
	if status != http.StatusConflict || e["state"] != "expired" {
		t.Fatalf("approving an expired request: %d %v", status, e)
	}
	if got := h.outboundStatus(msg); got != "dead" {
		t.Fatalf("the expired request ran: the delivery is %s", got)
	}
	status, list, _ := h.call("GET", "/api/v1/approvals?state=expired", nil, bob)
	if items, _ := list["approvals"].([]any); status != http.StatusOK || len(items) != 1 {
		t.Fatalf("the expired requests: %d %v", status, list)
	}
}

// A scoped approver runs a request only on the channels both people see:
// a lab-only approver's approval of an unscoped request's replay-dead
// touches lab rows only; a replay of an adt message is 404 to them and
// stays pending for someone who sees it.
func TestApprovedActionRunsInBothScopes(t *testing.T) {
	h := dualControl(t)
	lab, adt := h.toDestination("lab-a", "shared", true), h.toDestination("adt", "shared", true)
	alice, lena := h.user("alice", identity.RoleOperator), h.user("lena", identity.RoleOperator, "lab-*")

	status, body, _ := h.call("POST", fmt.Sprintf("/api/v1/messages/%d/replay", adt), nil, alice)
	replayADT := approvalID(t, status, body)
	if status, e, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", replayADT), nil, lena); status != http.StatusNotFound {
		t.Fatalf("a lab approver approving an adt replay: %d %v", status, e)
	}
	// Out of her scope, the adt replay is not even listed to her, nor
	// hers to reject: its message id would reveal an adt message.
	if status, list, _ := h.call("GET", "/api/v1/approvals?state=pending", nil, lena); status != http.StatusOK || len(list["approvals"].([]any)) != 0 {
		t.Fatalf("a lab approver's list of pending requests: %d %v; want none", status, list)
	}
	if status, e, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/reject", replayADT), nil, lena); status != http.StatusNotFound {
		t.Fatalf("a lab approver rejecting an adt replay: %d %v; want 404", status, e)
	}
	status, body, _ = h.call("POST", "/api/v1/dead/replay", map[string]any{"destination": "shared"}, alice)
	id := approvalID(t, status, body)
	if status, res, _ := h.call("POST", fmt.Sprintf("/api/v1/approvals/%d/approve", id), nil, lena); status != http.StatusOK {
		t.Fatalf("lena's approval: %d %v", status, res)
	}
	if l, a := h.outboundStatus(lab), h.outboundStatus(adt); l != "pending" || a != "dead" {
		t.Fatalf("after a lab approver's approval: lab-a %s, adt %s; want pending, dead", l, a)
	}
	status, list, _ := h.call("GET", "/api/v1/approvals?state=pending", nil, alice)
	if items, _ := list["approvals"].([]any); status != http.StatusOK || len(items) != 1 || items[0].(map[string]any)["id"] != float64(replayADT) {
		t.Fatalf("pending after the 404: %d %v", status, list)
	}
}
