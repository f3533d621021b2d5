package console

import (
	"net/http"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/leader"
)

// dashboardData is the dashboard's data; a part the person's role may not
// read is nil and not shown.
type dashboardData struct {
	Status *search.Status
	Firing []alert.Alert
	Nodes  []leader.Node
	// AlertsShown and NodesShown say whether the role reads them at all
	// (an empty list then means "none").
	AlertsShown, NodesShown bool
}

// dashboard is /: the per-channel and per-destination counts of
// GET /api/v1/status (already scoped by the API), the alerts firing and
// the nodes. console.js refreshes the counts from the same endpoint.
func (c *Console) dashboard(w http.ResponseWriter, r *http.Request, m *me) {
	var d dashboardData
	if m.Can(permStatus) {
		d.Status = &search.Status{}
		if _, err := c.call(r, http.MethodGet, "/api/v1/status", nil, "", d.Status); err != nil {
			c.fail(w, r, m, err)
			return
		}
	}
	if m.Can(permAlerts) {
		var out struct {
			Alerts []alert.Alert `json:"alerts"`
		}
		if _, err := c.call(r, http.MethodGet, "/api/v1/alerts", nil, "", &out); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.AlertsShown = true
		for _, a := range out.Alerts {
			if a.State == alert.AlertFiring {
				d.Firing = append(d.Firing, a)
			}
		}
	}
	if m.Can(permNodes) {
		var out struct {
			Nodes []leader.Node `json:"nodes"`
		}
		if _, err := c.call(r, http.MethodGet, "/api/v1/nodes", nil, "", &out); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.NodesShown, d.Nodes = true, out.Nodes
	}
	c.render(w, r, http.StatusOK, "dashboard", m, d)
}
