package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/mefor/mefor/internal/search"
)

// bodies is GET /api/v1/messages/{id}/body's answer.
type bodies struct {
	Raw     *string `json:"raw"`
	Replies []struct {
		ID     int64   `json:"id"`
		WorkID int64   `json:"work_id"`
		Body   *string `json:"body"`
	} `json:"replies"`
	Outbound []struct {
		WorkID      int64   `json:"work_id"`
		Destination string  `json:"destination"`
		Payload     *string `json:"payload"`
	} `json:"outbound"`
}

// shownBody is one body as the page shows it: its label and segments.
type shownBody struct {
	Label    string
	Purged   bool
	Segments []segment
}

// messageData is the message page's data.
type messageData struct {
	View   search.MessageView
	Bodies []shownBody
	// Shown is true once the body was asked for (and the API audited it).
	Shown bool
	// Notice is the outcome of an action just taken.
	Notice string
}

// message is /messages/{id}: the story of GET /api/v1/messages/{id},
// which answers 404 for a message out of the person's scope (the page
// does too). A POST asks for the body (action=body, read through GET
// /api/v1/messages/{id}/body, which audits it) or a replay (action=replay
// confirms first, action=replay-confirmed replays).
func (c *Console) message(w http.ResponseWriter, r *http.Request, m *me) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 || !m.Can(permMessagesRead) {
		c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
		return
	}
	var d messageData
	path := "/api/v1/messages/" + strconv.FormatInt(id, 10)
	if _, err := c.call(r, http.MethodGet, path, nil, "", &d.View); err != nil {
		c.fail(w, r, m, err)
		return
	}
	switch r.Method + " " + r.PostFormValue("action") {
	case "POST body":
		var b bodies
		if _, err := c.call(r, http.MethodGet, path+"/body", nil, "", &b); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.Shown, d.Bodies = true, shown(b)
	case "POST replay":
		c.render(w, r, http.StatusOK, "confirm", m, confirmData{Action: "/messages/" + strconv.FormatInt(id, 10), Field: "replay-confirmed",
			Question: fmt.Sprintf("Replay message %d?", id),
			Effect: fmt.Sprintf("Message %d of channel %s is routed again from the start: each destination is sent it once more.",
				id, d.View.Message.Channel),
			Button: "Replay message " + strconv.FormatInt(id, 10)})
		return
	case "POST replay-confirmed":
		var out map[string]any
		if _, err := c.call(r, http.MethodPost, path+"/replay", nil, m.CSRFToken, &out); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.Notice = "Replayed: the message is queued again."
		if a, ok := out["approval_id"]; ok {
			d.Notice = fmt.Sprintf("Replay needs a second person: approval request %v is waiting for someone else to approve it.", a)
		}
		// Re-read so the timeline shows the replay.
		if _, err := c.call(r, http.MethodGet, path, nil, "", &d.View); err != nil {
			c.fail(w, r, m, err)
			return
		}
	case "GET ":
	default:
		c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Unknown action."})
		return
	}
	c.render(w, r, http.StatusOK, "message", m, d)
}

// confirmData is a confirmation page: the question, what will happen,
// and the form that does it.
type confirmData struct {
	Question, Effect, Action, Field, Button string
	// Params are the form's other fields, sent back with the answer.
	Params []param
	// Approval, when set, says the action waits for a second person.
	Approval string
}

// param is a hidden form field.
type param struct{ Name, Value string }

func shown(b bodies) []shownBody {
	out := []shownBody{body("As received", b.Raw)}
	for _, o := range b.Outbound {
		out = append(out, body(fmt.Sprintf("As sent to %s (delivery %d)", o.Destination, o.WorkID), o.Payload))
	}
	for _, rp := range b.Replies {
		out = append(out, body(fmt.Sprintf("Reply %d to delivery %d", rp.ID, rp.WorkID), rp.Body))
	}
	return out
}

func body(label string, s *string) shownBody {
	if s == nil {
		return shownBody{Label: label, Purged: true}
	}
	return shownBody{Label: label, Segments: segments(*s)}
}

// segment is one HL7 segment, its fields numbered as HL7 names them.
type segment struct {
	Name   string
	Fields []field
}

// field is one field: its position (PID-3) and value.
type field struct {
	Pos, Value string
}

// segments splits an HL7 message into segments and fields for display,
// numbering MSH's fields from MSH-1 (the field separator itself). Text
// that is not HL7 comes out as one unnamed segment per line.
func segments(msg string) []segment {
	var out []segment
	for _, line := range strings.FieldsFunc(msg, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if len(line) < 4 || line[3] != '|' {
			out = append(out, segment{Fields: []field{{Value: line}}})
			continue
		}
		name := line[:3]
		parts := strings.Split(line[4:], "|")
		s := segment{Name: name}
		first := 1
		if name == "MSH" {
			s.Fields = append(s.Fields, field{Pos: "MSH-1", Value: "|"})
			first = 2
		}
		for i, p := range parts {
			s.Fields = append(s.Fields, field{Pos: fmt.Sprintf("%s-%d", name, first+i), Value: p})
		}
		out = append(out, s)
	}
	return out
}
