package console

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/mefor/mefor/leader"
)

// nodesData is /nodes' data.
type nodesData struct {
	Nodes  []leader.Node
	Notice string
}

// reauthData is the re-authentication dialog before a stepdown.
type reauthData struct {
	Node, Error string
	// Approval, when set, says the stepdown waits for a second person.
	Approval string
}

// stepdownAnswer is POST /api/v1/cluster/stepdown's answer (ops.StepdownAnswer,
// or a request for approval).
type stepdownAnswer struct {
	Outcome    string `json:"outcome"`
	Node       string `json:"node"`
	Holder     string `json:"holder"`
	NewHolder  string `json:"new_holder"`
	Reason     string `json:"reason"`
	ApprovalID int64  `json:"approval_id"`
}

// nodes is /nodes: GET /api/v1/nodes, the lease holder and each node's
// listener priority. A stepdown goes through a re-authentication dialog:
// action=stepdown shows it, action=stepdown-confirmed POSTs its password
// and code to /api/v1/reauth, then POSTs /api/v1/cluster/stepdown, so the
// API's rule (a fresh re-authentication for stepdown) decides.
func (c *Console) nodes(w http.ResponseWriter, r *http.Request, m *me) {
	if !m.Can(permNodes) {
		c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
		return
	}
	var d nodesData
	node := r.PostFormValue("node")
	switch r.Method + " " + r.PostFormValue("action") {
	case "GET ":
	case "POST stepdown":
		c.render(w, r, http.StatusOK, "reauth", m, c.reauthDialog(node, ""))
		return
	case "POST stepdown-confirmed":
		_, err := c.call(r, http.MethodPost, "/api/v1/reauth", map[string]string{"password": r.PostFormValue("password"),
			"totp": r.PostFormValue("totp")}, m.CSRFToken, nil)
		var e *apiError
		if errors.As(err, &e) && (e.Status == http.StatusUnauthorized || e.Status == http.StatusUnprocessableEntity || e.Status == http.StatusTooManyRequests) {
			c.render(w, r, e.Status, "reauth", m, c.reauthDialog(node, e.Message))
			return
		}
		if err != nil {
			c.fail(w, r, m, err)
			return
		}
		var a stepdownAnswer
		if _, err := c.call(r, http.MethodPost, "/api/v1/cluster/stepdown", map[string]string{"node": node}, m.CSRFToken, &a); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.Notice = stepdownNotice(a)
	default:
		c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Unknown action."})
		return
	}
	var out struct {
		Nodes []leader.Node `json:"nodes"`
	}
	if _, err := c.call(r, http.MethodGet, "/api/v1/nodes", nil, "", &out); err != nil {
		c.fail(w, r, m, err)
		return
	}
	d.Nodes = out.Nodes
	c.render(w, r, http.StatusOK, "nodes", m, d)
}

func (c *Console) reauthDialog(node, errText string) reauthData {
	d := reauthData{Node: node, Error: errText}
	if c.needsApproval(permStepdown) {
		d.Approval = "A stepdown needs a second person: this asks for approval, and another person who holds " + permStepdown +
			" must approve it on the Approvals page."
	}
	return d
}

// stepdownNotice says what the stepdown did, in the outcome's words.
func stepdownNotice(a stepdownAnswer) string {
	switch {
	case a.ApprovalID != 0:
		return fmt.Sprintf("Approval requested: request %d waits for another person who holds %s to approve it.", a.ApprovalID, permStepdown)
	case a.Reason != "":
		return fmt.Sprintf("Stepdown of %s: %s (%s).", nodeName(a.Node), a.Outcome, a.Reason)
	case a.NewHolder != "":
		return fmt.Sprintf("Stepdown of %s: %s; %s holds the lease now.", nodeName(a.Node), a.Outcome, a.NewHolder)
	}
	return fmt.Sprintf("Stepdown of %s: %s.", nodeName(a.Node), a.Outcome)
}
