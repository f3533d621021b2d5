package console

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/search"
)

// deadGroup is the dead letters of one destination (or, for a stage
// before delivery, one channel's stage) with one last error.
type deadGroup struct {
	Destination, Stage, Error string
	Channels                  []string
	Count                     int
	First, Last               time.Time
	// Messages are a few of the group's messages, newest first, for links.
	Messages []int64
}

// Target names what a replay of the group touches: the API replays a
// destination's (or a channel's) dead letters, whatever their error.
func (g deadGroup) Target() string {
	if g.Destination != "" {
		return "destination " + g.Destination
	}
	return "channel " + strings.Join(g.Channels, ", ")
}

// deadData is /dead's data.
type deadData struct {
	Groups []deadGroup
	// Total is the dead letters listed; Full is true when the API's
	// limit cut the list.
	Total int
	Full  bool
	// Approval is true when replay-dead waits for a second person.
	Approval bool
	Notice   string
}

// deadLimit is how many dead letters the page groups: the API's most.
const deadLimit = 1000

// dead is /dead: GET /api/v1/dead (scoped by the API) grouped by
// destination and error. A POST replays a destination's (or channel's)
// dead letters through POST /api/v1/dead/replay: action=replay confirms
// first, naming how many of each error will go, action=replay-confirmed
// replays, or asks for approval when access.approvals names replay-dead.
func (c *Console) dead(w http.ResponseWriter, r *http.Request, m *me) {
	if !m.Can(permDeadRead) {
		c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
		return
	}
	d := deadData{Approval: c.needsApproval(permReplayDead)}
	destination, channel := r.PostFormValue("destination"), r.PostFormValue("channel")
	switch r.Method + " " + r.PostFormValue("action") {
	case "GET ":
	case "POST replay":
		rows, err := c.deadRows(r, channel, destination)
		if err != nil {
			c.fail(w, r, m, err)
			return
		}
		c.confirmReplayDead(w, r, m, channel, destination, rows)
		return
	case "POST replay-confirmed":
		if destination == "" && channel == "" {
			c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Name a destination or a channel."})
			return
		}
		var out struct {
			Rows       int   `json:"rows"`
			Skipped    int   `json:"skipped"`
			ApprovalID int64 `json:"approval_id"`
		}
		if _, err := c.call(r, http.MethodPost, "/api/v1/dead/replay", map[string]string{"destination": destination, "channel": channel},
			m.CSRFToken, &out); err != nil {
			c.fail(w, r, m, err)
			return
		}
		d.Notice = fmt.Sprintf("Replayed: %d dead letters are queued again.", out.Rows)
		if out.Skipped > 0 {
			d.Notice += fmt.Sprintf(" %d were left dead: their bodies were purged.", out.Skipped)
		}
		if out.ApprovalID != 0 {
			d.Notice = fmt.Sprintf("Approval requested: request %d waits for another person who holds %s to approve it on the Approvals page. "+
				"Nothing is replayed until then.", out.ApprovalID, permReplayDead)
		}
	default:
		c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Unknown action."})
		return
	}
	rows, err := c.deadRows(r, "", "")
	if err != nil {
		c.fail(w, r, m, err)
		return
	}
	d.Groups, d.Total, d.Full = groupDead(rows), len(rows), len(rows) == deadLimit
	c.render(w, r, http.StatusOK, "dead", m, d)
}

// deadRows is GET /api/v1/dead for channel and destination (empty: all).
func (c *Console) deadRows(r *http.Request, channel, destination string) ([]search.DeadRow, error) {
	path := fmt.Sprintf("/api/v1/dead?limit=%d", deadLimit)
	if channel != "" {
		path += "&channel=" + urlEscape(channel)
	}
	if destination != "" {
		path += "&destination=" + urlEscape(destination)
	}
	var out struct {
		Dead []search.DeadRow `json:"dead"`
	}
	_, err := c.call(r, http.MethodGet, path, nil, "", &out)
	return out.Dead, err
}

// confirmReplayDead is the confirmation page: what a replay of the
// destination (or channel) touches, error by error, and who must approve
// it when it waits for a second person.
func (c *Console) confirmReplayDead(w http.ResponseWriter, r *http.Request, m *me, channel, destination string, rows []search.DeadRow) {
	if destination == "" && channel == "" {
		c.render(w, r, http.StatusUnprocessableEntity, "error", m, errorPage{Title: "Refused", Message: "Name a destination or a channel."})
		return
	}
	groups := groupDead(rows)
	what := "destination " + destination
	if destination == "" {
		what = "channel " + channel
	} else if channel != "" {
		what += " of channel " + channel
	}
	var errs []string
	for _, g := range groups {
		errs = append(errs, fmt.Sprintf("%d with %q", g.Count, cmp.Or(g.Error, "no error recorded")))
	}
	effect := fmt.Sprintf("The %d dead letters of %s are queued again, each sent once more: %s.", len(rows), what, strings.Join(errs, "; "))
	cd := confirmData{Action: "/dead", Field: "replay-confirmed", Question: "Replay the dead letters of " + what + "?", Effect: effect,
		Button: "Replay dead letters of " + what,
		Params: []param{{"destination", destination}, {"channel", channel}}}
	if c.needsApproval(permReplayDead) {
		cd.Button = "Request approval"
		cd.Approval = "Replaying dead letters needs a second person: this asks for approval, and another person who holds " +
			permReplayDead + " must approve it on the Approvals page before anything is replayed."
	}
	c.render(w, r, http.StatusOK, "confirm", m, cd)
}

// groupDead groups rows by destination (or channel and stage, before
// delivery) and last error, the largest group first.
func groupDead(rows []search.DeadRow) []deadGroup {
	type key struct{ dest, stage, channel, err string }
	idx := map[key]int{}
	var out []deadGroup
	for _, row := range rows {
		k := key{dest: row.Destination, err: row.LastError}
		if row.Destination == "" {
			k.stage, k.channel = row.Stage, row.Channel
		}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, deadGroup{Destination: row.Destination, Stage: row.Stage, Error: row.LastError, First: row.DeadAt, Last: row.DeadAt})
		}
		g := &out[i]
		g.Count++
		if !slices.Contains(g.Channels, row.Channel) {
			g.Channels = append(g.Channels, row.Channel)
		}
		if row.DeadAt.Before(g.First) {
			g.First = row.DeadAt
		}
		if row.DeadAt.After(g.Last) {
			g.Last = row.DeadAt
		}
		if len(g.Messages) < 5 && !slices.Contains(g.Messages, row.MessageID) {
			g.Messages = append(g.Messages, row.MessageID)
		}
	}
	for i := range out {
		slices.Sort(out[i].Channels)
	}
	slices.SortStableFunc(out, func(a, b deadGroup) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Destination, b.Destination), cmp.Compare(a.Error, b.Error))
	})
	return out
}
