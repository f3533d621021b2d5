package console

import (
	"html/template"
	"net/http"
	"net/url"

	"github.com/mefor/mefor/internal/search"
)

// filters are the search form's fields. The first group goes in the
// URL of a GET; Patient and Text only ever in a POSTed form.
type filters struct {
	Channel, Destination, Status, ControlID, Type, Since, Until string
	Patient, Text                                               string
}

// urlFields are the filters a GET /messages carries, by the API's query
// parameter names.
func (f filters) URLFields() map[string]string {
	return map[string]string{"channel": f.Channel, "destination": f.Destination, "status": f.Status, "control_id": f.ControlID,
		"type": f.Type, "since": f.Since, "until": f.Until}
}

// Query is the URL's query for these filters (never Patient or Text),
// with cursor when set.
func (f filters) Query(cursor string) string {
	v := url.Values{}
	for k, s := range f.URLFields() {
		if s != "" {
			v.Set(k, s)
		}
	}
	if cursor != "" {
		v.Set("cursor", cursor)
	}
	return v.Encode()
}

// Link is /messages with these filters and cursor, for a link (its
// query is built here, not escaped a second time by the template).
func (f filters) Link(cursor string) template.URL {
	return template.URL("/messages?" + f.Query(cursor))
}

// Content reports whether the search is by patient or text.
func (f filters) Content() bool { return f.Patient != "" || f.Text != "" }

func filtersOf(r *http.Request, withContent bool) filters {
	get := r.FormValue
	if r.Method == http.MethodPost {
		get = r.PostFormValue
	}
	f := filters{Channel: get("channel"), Destination: get("destination"), Status: get("status"), ControlID: get("control_id"),
		Type: get("type"), Since: get("since"), Until: get("until")}
	if withContent {
		f.Patient, f.Text = r.PostFormValue("patient"), r.PostFormValue("text")
	}
	return f
}

// messagesData is the search page's data.
type messagesData struct {
	Filters  filters
	Messages []search.MessageSummary
	Next     string
	// Posted is a search whose next page is POSTed too (its filters may
	// hold a patient identifier).
	Posted bool
	// Searched is false on a first visit with no filters: the page then
	// lists the newest messages.
	Searched bool
}

// messages is /messages: a GET lists with the filters in the URL (GET
// /api/v1/messages); a POST, the only way to search by patient or text,
// sends every filter in the body of POST /api/v1/messages/search, so the
// identifier never reaches a URL, a log or the browser's history.
func (c *Console) messages(w http.ResponseWriter, r *http.Request, m *me) {
	if !m.Can(permMessagesRead) {
		c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
		return
	}
	d := messagesData{Posted: r.Method == http.MethodPost}
	if r.Method == http.MethodGet {
		for k := range r.URL.Query() {
			if k == "patient" || k == "text" {
				// A link someone made by hand: refuse rather than search,
				// as the API does, so the habit does not take.
				c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused",
					Message: "A patient identifier or text never goes in a URL: use the search form."})
				return
			}
		}
	}
	d.Filters = filtersOf(r, d.Posted)
	cursor := r.FormValue("cursor")
	if d.Posted {
		cursor = r.PostFormValue("cursor")
	}
	d.Searched = d.Filters != (filters{}) || cursor != ""
	var out struct {
		Messages []search.MessageSummary `json:"messages"`
		Next     *string                 `json:"next"`
	}
	var err error
	if d.Posted {
		f := d.Filters
		body := map[string]any{"channel": f.Channel, "destination": f.Destination, "status": f.Status, "control_id": f.ControlID,
			"type": f.Type, "since": f.Since, "until": f.Until, "patient": f.Patient, "text": f.Text, "cursor": cursor}
		_, err = c.call(r, http.MethodPost, "/api/v1/messages/search", body, m.CSRFToken, &out)
	} else {
		_, err = c.call(r, http.MethodGet, "/api/v1/messages?"+d.Filters.Query(cursor), nil, "", &out)
	}
	if err != nil {
		c.fail(w, r, m, err)
		return
	}
	d.Messages = out.Messages
	if out.Next != nil {
		d.Next = *out.Next
	}
	c.render(w, r, http.StatusOK, "messages", m, d)
}
