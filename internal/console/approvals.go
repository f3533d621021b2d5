package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/mefor/mefor/internal/approval"
)

// approvalsData is /approvals' data.
type approvalsData struct {
	Pending []shownApproval
	Notice  string
}

// shownApproval is a request with what it would do, in words.
type shownApproval struct {
	approval.Approval
	What string
	// Own is true for the person's own request: another must decide it.
	Own bool
}

// approvals is /approvals: the pending requests of GET /api/v1/approvals
// (those of the actions the person holds the permission of), with
// approve and reject (POST /api/v1/approvals/{id}/approve or reject). The
// API refuses a person's own request; the page says so instead of
// showing the buttons. Without access.approvals the API answers 404, and
// so does the page.
func (c *Console) approvals(w http.ResponseWriter, r *http.Request, m *me) {
	var d approvalsData
	switch r.Method + " " + r.PostFormValue("action") {
	case "GET ":
	case "POST approve", "POST reject":
		id, err := strconv.ParseInt(r.PostFormValue("id"), 10, 64)
		if err != nil || id <= 0 {
			c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such request."})
			return
		}
		verb := r.PostFormValue("action")
		var out struct {
			Approval approval.Approval `json:"approval"`
		}
		if _, err := c.call(r, http.MethodPost, fmt.Sprintf("/api/v1/approvals/%d/%s", id, verb), nil, m.CSRFToken, &out); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.Notice = fmt.Sprintf("Request %d rejected: nothing was done.", id)
		if verb == "approve" {
			d.Notice = fmt.Sprintf("Request %d approved: %s (%s).", id, describe(out.Approval), out.Approval.State)
		}
	default:
		c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Unknown action."})
		return
	}
	var out struct {
		Approvals []approval.Approval `json:"approvals"`
	}
	if _, err := c.call(r, http.MethodGet, "/api/v1/approvals?state=pending", nil, "", &out); err != nil {
		c.fail(w, r, m, err)
		return
	}
	for _, a := range out.Approvals {
		d.Pending = append(d.Pending, shownApproval{Approval: a, What: describe(a), Own: a.RequestedBy == m.User})
	}
	c.render(w, r, http.StatusOK, "approvals", m, d)
}

// describe says what a request's action does, from its parameters (the
// API's actionParams: ids, channels, destinations and nodes, no content).
func describe(a approval.Approval) string {
	var p struct {
		MessageID   int64  `json:"message_id"`
		Channel     string `json:"channel"`
		Destination string `json:"destination"`
		Top         bool   `json:"top"`
		Node        string `json:"node"`
	}
	_ = json.Unmarshal(a.Params, &p)
	var of []string
	if p.Destination != "" {
		of = append(of, "destination "+p.Destination)
	}
	if p.Channel != "" {
		of = append(of, "channel "+p.Channel)
	}
	where := strings.Join(of, " of ")
	switch a.Action {
	case permReplay:
		return fmt.Sprintf("replay message %d", p.MessageID)
	case permReplayDead:
		return "replay the dead letters of " + where
	case "cancel":
		if p.Top {
			return "cancel the head delivery of " + where
		}
		return "cancel the pending deliveries of " + where
	case permStepdown:
		return "step down " + nodeName(p.Node)
	}
	return a.Action
}

// nodeName is a stepdown's node, "" naming whichever holds the lease.
func nodeName(n string) string {
	if n == "" {
		return "the lease holder"
	}
	return n
}
