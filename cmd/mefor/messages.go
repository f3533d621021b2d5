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

	"github.com/mefor/mefor/internal/store"
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
  mefor messages show 42
  mefor messages show 42 --body`
}

type messagesListCmd struct {
	Channel string `placeholder:"NAME" help:"Only messages of this channel."`
	Status  string `enum:",received,routed,unrouted,filtered,processed,error" default:"" placeholder:"STATUS" help:"Only messages with this status: received, routed, unrouted, filtered, processed or error."`
	Limit   int    `default:"50" help:"How many messages to show at most."`
	JSON    bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *messagesListCmd) Help() string {
	return `Lists messages newest first: id, when received, channel, HL7 type, control id
(MSH-10), status and size in bytes.

Examples:
  mefor messages list
  mefor messages list --channel adt --status error --limit 200
  mefor messages list --json | jq '.[].id'`
}

func (c *messagesListCmd) Run(ctx context.Context, g *Globals) error {
	if c.Limit <= 0 {
		return errors.New("--limit must be at least 1")
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	msgs, err := ops.ListMessages(ctx, pool, store.MessageFilter{Channel: c.Channel, Status: c.Status, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		if msgs == nil {
			msgs = []store.MessageSummary{}
		}
		return writeJSON(g.stdout, msgs)
	}
	if len(msgs) == 0 {
		fmt.Fprintln(g.stdout, "no messages")
		return nil
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "ID\tRECEIVED\tCHANNEL\tTYPE\tCONTROL ID\tSTATUS\tSIZE")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\n", m.ID, fmtTime(m.ReceivedAt), m.Channel,
			orDash(m.Type()), orDash(oneLine(m.ControlID)), m.Status, m.Size)
	}
	return tw.Flush()
}

type messagesShowCmd struct {
	ID   int64 `arg:"" help:"Message id."`
	Body bool  `help:"Also print the stored body and the partners' reply bodies (protected health information)."`
	JSON bool  `name:"json" help:"Print JSON instead of text."`
}

func (c *messagesShowCmd) Help() string {
	return `Shows one message: its header fields, status and error, every stage row
(ingress, routed, outbound) with its lane, seq, attempts and last error, what
each partner answered to each delivery attempt, and the event timeline.
A message read from a file names the file (size, SHA-256, its place in it);
a reply routed back in (a destination's reply_to) names its parent, the
message whose delivery it answered; and a message whose partners' replies
were routed back in lists them under "Replies routed in".

The body is shown only with --body: as text with each segment on its own line,
or in JSON as the string "body" (a body that is not UTF-8 is decoded as
ISO-8859-1, and "body_charset" says so).

Examples:
  mefor messages show 42
  mefor messages show 42 --body
  mefor messages show 42 --json | jq '.work[] | select(.status == "dead")'`
}

// messageShowJSON is `messages show --json`.
type messageShowJSON struct {
	*ops.MessageView
	Body        *string     `json:"body,omitempty"`
	BodyCharset string      `json:"body_charset,omitempty"`
	Replies     []replyJSON `json:"replies"`
}

type replyJSON struct {
	store.Reply
	Body        *string `json:"body,omitempty"`
	BodyCharset string  `json:"body_charset,omitempty"`
}

func (c *messagesShowCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	v, err := ops.ShowMessage(ctx, pool, c.ID, c.Body)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("message %d not found", c.ID)
	}
	if err != nil {
		return err
	}
	if c.JSON {
		out := messageShowJSON{MessageView: v, Replies: []replyJSON{}}
		if v.Work == nil {
			v.Work = []store.WorkInfo{}
		}
		if v.Events == nil {
			v.Events = []store.Event{}
		}
		if c.Body && v.Message.Raw != nil {
			s, cs := bodyText(v.Message.Raw)
			out.Body, out.BodyCharset = &s, cs
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
	field("Size", fmt.Sprintf("%d bytes", m.Size))
	if m.BodyPurgedAt != nil {
		field("Body purged", fmtTime(*m.BodyPurgedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nStage rows:")
	if len(v.Work) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw = newTable(w)
		fmt.Fprintln(tw, "  ID\tSTAGE\tLANE\tSEQ\tSTATUS\tATTEMPTS\tNEXT ATTEMPT\tTARGET\tLAST ERROR")
		for _, r := range v.Work {
			next := "-"
			if r.NextAttemptAt != nil {
				next = fmtTime(*r.NextAttemptAt)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Stage, r.Lane, r.Seq, r.Status,
				r.Attempts, next, orDash(target(r)), orDash(oneLine(r.LastError)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nPartner replies:")
	if len(v.Replies) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw = newTable(w)
		fmt.Fprintln(tw, "  AT\tWORK\tDESTINATION\tATTEMPT\tOUTCOME\tACK")
		for _, r := range v.Replies {
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%d\t%s\t%s\n", fmtTime(r.ReceivedAt), r.WorkID, r.Destination,
				r.Attempt, oneLine(r.Outcome), orDash(oneLine(r.AckCode)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if err := printReplyMessages(w, v.Origin.Replies); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nTimeline:")
	if len(v.Events) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw = newTable(w)
		for _, e := range v.Events {
			where := ""
			if e.WorkID != 0 {
				where = fmt.Sprintf("row %d", e.WorkID)
			}
			if e.Destination != "" {
				where = strings.TrimSpace(where + " → " + e.Destination)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", fmtTime(e.At), e.Event, where, oneLine(e.Detail))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if !withBody {
		return nil
	}
	fmt.Fprintln(w, "\nBody:")
	if m.Raw == nil {
		fmt.Fprintln(w, "  (purged)")
	} else {
		writeSegments(w, m.Raw)
	}
	for _, r := range v.Replies {
		if r.Body == nil {
			continue
		}
		fmt.Fprintf(w, "\nReply from %s to row %d, attempt %d:\n", r.Destination, r.WorkID, r.Attempt)
		writeSegments(w, r.Body)
	}
	return nil
}

// target names what a stage row works for: its destination, or its
// route/handler.
func target(r store.WorkInfo) string {
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
