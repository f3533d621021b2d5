package console

import (
	"net/http"
	"net/url"
	"time"

	"github.com/mefor/mefor/internal/audit"
)

// auditData is /audit's data.
type auditData struct {
	Actor, Action, Since, Until string
	Rows                        []audit.Record
	// Full is true when the API's limit cut the rows before the
	// console's filters by person and end time.
	Full  bool
	Error string
}

// auditLimit is how many rows the page asks the API for: its most.
const auditLimit = 1000

// audit is /audit: GET /api/v1/audit (since and action), newest first,
// narrowed here by person (actor) and end time (until), which the API
// does not filter on. A user with a channel scope is refused by the API
// (the log spans every channel), and gets the page's 404.
func (c *Console) audit(w http.ResponseWriter, r *http.Request, m *me) {
	if !m.Can(permAuditRead) || len(m.Channels) > 0 {
		c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
		return
	}
	q := r.URL.Query()
	d := auditData{Actor: q.Get("actor"), Action: q.Get("action"), Since: q.Get("since"), Until: q.Get("until")}
	var until time.Time
	if d.Until != "" {
		t, err := parseWhen(d.Until)
		if err != nil {
			d.Error = "until is a time such as 2024-05-01T10:00 or 2024-05-01"
			c.render(w, r, http.StatusUnprocessableEntity, "audit", m, d)
			return
		}
		until = t
	}
	v := url.Values{"limit": {"1000"}}
	if d.Action != "" {
		v.Set("action", d.Action)
	}
	if d.Since != "" {
		t, err := parseWhen(d.Since)
		if err != nil {
			d.Error = "since is a time such as 2024-05-01T10:00 or 2024-05-01"
			c.render(w, r, http.StatusUnprocessableEntity, "audit", m, d)
			return
		}
		v.Set("since", t.UTC().Format(time.RFC3339))
	}
	var out struct {
		Audit []audit.Record `json:"audit"`
	}
	if _, err := c.call(r, http.MethodGet, "/api/v1/audit?"+v.Encode(), nil, "", &out); err != nil {
		c.fail(w, r, m, err)
		return
	}
	d.Full = len(out.Audit) == auditLimit
	for _, rec := range out.Audit {
		if d.Actor != "" && rec.Actor != d.Actor {
			continue
		}
		if !until.IsZero() && rec.At.After(until) {
			continue
		}
		d.Rows = append(d.Rows, rec)
	}
	c.render(w, r, http.StatusOK, "audit", m, d)
}

// parseWhen reads a time as the form's datetime-local input sends it
// (taken as UTC), as RFC 3339, or a date.
func parseWhen(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	_, err := time.Parse(time.RFC3339, s)
	return time.Time{}, err
}
