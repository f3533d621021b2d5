package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/ops"
)

type messagesCmd struct {
	List messagesListCmd `cmd:"" help:"List messages, newest first (metadata only)."`
	Show messagesShowCmd `cmd:"" help:"Show one message: header, stage rows, partner replies and timeline."`
}

func (c *messagesCmd) Help() string {
	return `Inspect stored messages. Listings never show message content; 'show --body'
prints the stored body (protected health information: mind where it goes).

Examples:
  mefor messages list --channel adt --status error
  mefor messages list --patient 123456 --since 7d
  mefor messages show 42
  mefor messages show MSG00042 --body`
}

type messagesListCmd struct {
	Channel     string `placeholder:"NAME" help:"Only messages of this channel."`
	Status      string `enum:",received,routed,unrouted,filtered,processed,error" default:"" placeholder:"STATUS" help:"Only messages with this status: received, routed, unrouted, filtered, processed or error."`
	ControlID   string `name:"control-id" placeholder:"MSH-10" help:"Only messages with this control id (MSH-10), exactly."`
	Patient     string `placeholder:"ID" help:"Only messages about this patient: PID-3.1 as received, exactly."`
	Type        string `placeholder:"TYPE" help:"Only messages of this HL7 type: ADT (any trigger) or ADT^A08."`
	Since       string `placeholder:"WHEN" help:"Only messages received at or after WHEN: RFC 3339 (2024-05-01T08:00:00Z), a date (2024-05-01) or how long ago (2h, 7d)."`
	Until       string `placeholder:"WHEN" help:"Only messages received before WHEN (same forms as --since)."`
	Destination string `placeholder:"NAME" help:"Only messages with a delivery to this destination (queued, delivered, dead or cancelled)."`
	Text        string `placeholder:"TEXT" help:"Only messages whose body contains TEXT (case-sensitive). Reads every body the other filters leave: slow on a large store."`
	Limit       int    `default:"50" help:"How many messages to show at most."`
	JSON        bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *messagesListCmd) Help() string {
	return `Lists messages newest first: id, when received, channel, HL7 type, control id
(MSH-10), status and size in bytes as received ("cut at N" when only the
first N bytes of a frame that did not parse were kept; "cut_at" in JSON).
Filters combine (all must hold).

Every filter but --text is answered from an index, so it stays fast on a
store of millions of messages. --text reads the stored bodies of every
message the other filters leave (and finds nothing in purged ones): narrow it
with --channel, --type or --since first on a large store. --patient matches
PID-3.1 as stored at intake; messages stored before this version have none.

Examples:
  mefor messages list
  mefor messages list --channel adt --status error --limit 200
  mefor messages list --control-id MSG00042
  mefor messages list --patient 123456 --since 7d
  mefor messages list --type ADT^A08 --since 2024-05-01T00:00:00Z --until 2024-05-02T00:00:00Z
  mefor messages list --destination lab --status error
  mefor messages list --channel adt --since 2h --text 'DOE^JANE'
  mefor messages list --json | jq '.[].id'`
}

func (c *messagesListCmd) Run(ctx context.Context, g *Globals) error {
	if c.Limit <= 0 {
		return errors.New("--limit must be at least 1")
	}
	now := time.Now()
	since, err := parseWhen("since", c.Since, now)
	if err != nil {
		return err
	}
	until, err := parseWhen("until", c.Until, now)
	if err != nil {
		return err
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return fmt.Errorf("--since (%s) must be before --until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	return queryList(ctx, g, c.JSON, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.MessageSummary, error) {
		return ops.ListMessages(ctx, pool, ops.MessageFilter{
			Channel: c.Channel, Status: c.Status, ControlID: c.ControlID, Patient: c.Patient, Type: c.Type,
			Since: since, Until: until, Destination: c.Destination, Text: c.Text, Limit: c.Limit, Keys: kr,
		})
	}, summaries)
}

// summaries is the table of `messages list`.
var summaries = listing[ops.MessageSummary]{
	Empty:  "no messages",
	Header: "ID\tRECEIVED\tCHANNEL\tTYPE\tCONTROL ID\tSTATUS\tSIZE",
	Row: func(w io.Writer, m ops.MessageSummary) {
		size := strconv.Itoa(m.Size)
		if m.CutAt > 0 {
			size += fmt.Sprintf(" (cut at %d)", m.CutAt)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, fmtTime(m.ReceivedAt), m.Channel,
			orDash(m.Type()), orDash(oneLine(m.ControlID)), m.Status, size)
	},
}

// fmtSize is a message's size for `messages show`, and where its stored
// body was cut.
func fmtSize(m ops.MessageSummary) string {
	if m.CutAt > 0 {
		return fmt.Sprintf("%d bytes, cut at %d of %d bytes (only the first keep_unparseable bytes of a frame that does not parse are kept)",
			m.Size, m.CutAt, m.Size)
	}
	return fmt.Sprintf("%d bytes", m.Size)
}

type messagesShowCmd struct {
	ID   string `arg:"" placeholder:"ID|CONTROL-ID" help:"Message id, or its control id (MSH-10)."`
	Body bool   `help:"Also print the stored body, each delivery's payload as sent and the partners' replies (protected health information)."`
	JSON bool   `name:"json" help:"Print JSON instead of text."`
}

func (c *messagesShowCmd) Help() string {
	return `Shows one message: its header fields, status and error, every stage row
(ingress, routed, outbound) with its lane, seq, attempts and last error, what
each partner answered to each delivery attempt, and the event timeline.
A message read from a file names the file (size, SHA-256, its place in it);
a reply routed back in (a destination's reply_to) names its parent, the
message whose delivery it answered; and a message whose partners' replies
were routed back in lists them under "Replies routed in".

The message is named by its id, or by its control id (MSH-10). A number is
taken as an id when a message has that id; when a control id matches several
messages, they are listed and the command asks for one of their ids.

With --body it also prints the message's whole story: the body as received,
then for each destination the payload as it was sent (after the handler's
transforms) followed by the partner's reply to each attempt. As text each
segment is on its own line; in JSON they are the strings "body",
"outbound[].payload" and "replies[].body" (a body that is not UTF-8 is
decoded as ISO-8859-1, and the matching "..._charset" says so).

Examples:
  mefor messages show 42
  mefor messages show MSG00042
  mefor messages show 42 --body
  mefor messages show 42 --json | jq '.work[] | select(.status == "dead")'`
}

// messageShowJSON is `messages show --json`.
type messageShowJSON struct {
	*ops.MessageView
	Body        *string        `json:"body,omitempty"`
	BodyCharset string         `json:"body_charset,omitempty"`
	Outbound    []outboundJSON `json:"outbound,omitempty"`
	Replies     []replyJSON    `json:"replies"`
}

type outboundJSON struct {
	ops.Outbound
	Payload        *string `json:"payload"`
	PayloadCharset string  `json:"payload_charset,omitempty"`
}

type replyJSON struct {
	ops.Reply
	Body        *string `json:"body,omitempty"`
	BodyCharset string  `json:"body_charset,omitempty"`
}

func (c *messagesShowCmd) Run(ctx context.Context, g *Globals) error {
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	id, matches, also, err := ops.FindMessage(ctx, pool, c.ID)
	if err != nil {
		return err
	}
	switch {
	case id == 0 && len(matches) == 0:
		return fmt.Errorf("message %s not found (no message has that id or control id)", c.ID)
	case id == 0:
		fmt.Fprintf(g.stdout, "%d messages have control id %q:\n", len(matches), c.ID)
		if err := printList(g.stdout, false, matches, summaries); err != nil {
			return err
		}
		return fmt.Errorf("control id %q names several messages; run 'mefor messages show ID' with one of the ids above", c.ID)
	case len(also) > 0:
		fmt.Fprintf(g.stderr, "note: %q is message %d's id; %d other message(s) have it as control id (mefor messages list --control-id %s)\n",
			c.ID, id, len(also), c.ID)
	}
	v, err := ops.ShowMessage(ctx, pool, kr, id, c.Body)
	if errors.Is(err, ops.ErrNotFound) {
		return fmt.Errorf("message %d not found", id)
	}
	if err != nil {
		return err
	}
	if c.JSON {
		out := messageShowJSON{MessageView: v, Replies: []replyJSON{}}
		if v.Work == nil {
			v.Work = []ops.WorkInfo{}
		}
		if v.Events == nil {
			v.Events = []ops.Event{}
		}
		if c.Body && v.Message.Raw != nil {
			s, cs := bodyText(v.Message.Raw)
			out.Body, out.BodyCharset = &s, cs
		}
		for _, o := range v.Outbound {
			oj := outboundJSON{Outbound: o}
			if o.Payload != nil {
				s, cs := bodyText(o.Payload)
				oj.Payload, oj.PayloadCharset = &s, cs
			}
			out.Outbound = append(out.Outbound, oj)
		}
		for _, r := range v.Replies {
			rj := replyJSON{Reply: r}
			if c.Body && r.Body != nil {
				s, cs := bodyText(r.Body)
				rj.Body, rj.BodyCharset = &s, cs
			}
			out.Replies = append(out.Replies, rj)
		}
		return writeJSON(g.stdout, out)
	}
	return printMessage(g.stdout, v, c.Body)
}

func printMessage(w io.Writer, v *ops.MessageView, withBody bool) error {
	m := v.Message
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	field := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", name, value)
		}
	}
	field("Message", strconv.FormatInt(m.ID, 10))
	field("Channel", m.Channel)
	field("Status", m.Status)
	field("Error", oneLine(m.Error))
	field("Received", fmtTime(m.ReceivedAt))
	field("Updated", fmtTime(m.UpdatedAt))
	source := m.Source
	if m.RemoteAddr != "" {
		source += " from " + m.RemoteAddr
	}
	field("Source", source)
	field("Source identity", oneLine(m.SourceIdentity))
	originFields(field, v.Origin)
	field("Type", m.Type())
	field("Control ID", oneLine(m.ControlID))
	field("Sending app", oneLine(m.SendingApp))
	field("Sending facility", oneLine(m.SendingFacility))
	field("Size", fmtSize(m.MessageSummary))
	if m.BodyPurgedAt != nil {
		field("Body purged", fmtTime(*m.BodyPurgedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	err := printSection(w, "Stage rows", v.Work,
		"ID\tSTAGE\tLANE\tSEQ\tSTATUS\tATTEMPTS\tNEXT ATTEMPT\tTARGET\tLAST ERROR",
		func(w io.Writer, r ops.WorkInfo) {
			next := "-"
			if r.NextAttemptAt != nil {
				next = fmtTime(*r.NextAttemptAt)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Stage, r.Lane, r.Seq, r.Status,
				r.Attempts, next, orDash(target(r)), orDash(oneLine(r.LastError)))
		})
	if err != nil {
		return err
	}
	err = printSection(w, "Partner replies", v.Replies, "AT\tWORK\tDESTINATION\tATTEMPT\tOUTCOME\tACK",
		func(w io.Writer, r ops.Reply) {
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%s\n", fmtTime(r.ReceivedAt), r.WorkID, r.Destination,
				r.Attempt, oneLine(r.Outcome), orDash(oneLine(r.AckCode)))
		})
	if err != nil {
		return err
	}
	if err := printReplyMessages(w, v.Origin.Replies); err != nil {
		return err
	}
	err = printSection(w, "Timeline", v.Events, "", func(w io.Writer, e ops.Event) {
		where := ""
		if e.WorkID != 0 {
			where = fmt.Sprintf("row %d", e.WorkID)
		}
		if e.Destination != "" {
			where = strings.TrimSpace(where + " → " + e.Destination)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", fmtTime(e.At), e.Event, where, oneLine(e.Detail))
	})
	if err != nil {
		return err
	}

	if !withBody {
		return nil
	}
	fmt.Fprintln(w, "\nBody:")
	if m.Raw == nil {
		fmt.Fprintln(w, "  (purged)")
	} else {
		writeSegments(w, m.Raw)
		if m.CutAt > 0 {
			fmt.Fprintf(w, "  (cut at %d of %d bytes: the listener keeps only the first keep_unparseable bytes of a frame that does not parse)\n",
				m.CutAt, m.Size)
		}
	}
	shown := map[int64]bool{}
	for _, o := range v.Outbound {
		shown[o.WorkID] = true
		fmt.Fprintf(w, "\nSent to %s (row %d, %s, %d attempts):\n", o.Destination, o.WorkID, o.Status, o.Attempts)
		if o.Payload == nil {
			fmt.Fprintln(w, "  (purged)")
		} else {
			writeSegments(w, o.Payload)
		}
		for _, r := range v.Replies {
			if r.WorkID == o.WorkID {
				printReply(w, r)
			}
		}
	}
	for _, r := range v.Replies {
		if !shown[r.WorkID] {
			printReply(w, r)
		}
	}
	return nil
}

// printReply prints what a partner answered to one attempt.
func printReply(w io.Writer, r ops.Reply) {
	fmt.Fprintf(w, "\nReply from %s to row %d, attempt %d (%s):\n", r.Destination, r.WorkID, r.Attempt, oneLine(r.Outcome))
	if r.Body == nil {
		fmt.Fprintln(w, "  (no reply)")
		return
	}
	writeSegments(w, r.Body)
}

// target names what a stage row works for: its destination, or its
// route/handler.
func target(r ops.WorkInfo) string {
	switch {
	case r.Destination != "":
		return r.Destination
	case r.Route != "" && r.Handler != "":
		return r.Route + "/" + r.Handler
	default:
		return r.Route + r.Handler
	}
}

// writeSegments prints an HL7 body for a human: segments end in \r, which a
// terminal would overprint, so each becomes a line of its own.
func writeSegments(w io.Writer, raw []byte) {
	s := strings.ReplaceAll(string(raw), "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	s = strings.TrimRight(s, "\n")
	fmt.Fprintln(w, s)
}

// bodyText turns a stored body into a JSON string. HL7 v2 does not promise
// UTF-8; a body that is not valid UTF-8 is decoded byte for byte as
// ISO-8859-1 (HL7's most common other charset) rather than mangled.
func bodyText(raw []byte) (string, string) {
	if utf8.Valid(raw) {
		return string(raw), "utf-8"
	}
	runes := make([]rune, len(raw))
	for i, b := range raw {
		runes[i] = rune(b)
	}
	return string(runes), "iso-8859-1"
}

// newTable is the tabwriter every listing uses.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// fmtTime prints a timestamp in local time to the second.
func fmtTime(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05") }

// oneLine keeps a stored text on one table line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '\r', '\n', '\t':
			return ' '
		}
		return r
	}, s)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
