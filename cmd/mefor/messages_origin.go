package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/mefor/mefor/internal/search"
)

// originFields adds a message's file and parent to the header of
// `messages show`.
func originFields(field func(name, value string), o search.Origin) {
	if f := o.File; f != nil {
		taken := ""
		if f.Node != "" {
			taken = " by node " + f.Node
		}
		field("File", fmt.Sprintf("%s, message %d of %d (%d bytes, sha256 %s, stored %s%s)",
			oneLine(f.Name), f.Index, f.Messages, f.Size, f.SHA256, fmtTime(f.StoredAt), taken))
	}
	if p := o.Parent; p != nil {
		reply := "reply"
		if p.Destination != "" {
			reply = fmt.Sprintf("reply from destination %s (attempt %d)", p.Destination, p.Attempt)
		}
		field("Parent", fmt.Sprintf("message %d (%s, %s, %s): this is its %s", p.ID, p.Channel, orDash(p.Type()), p.Status, reply))
	}
	if o.ReplyDepth > 0 {
		field("Reply depth", strconv.Itoa(o.ReplyDepth))
	}
}

// printReplyMessages lists the messages stored from the replies to a
// message's deliveries.
func printReplyMessages(w io.Writer, replies []search.LinkedMessage) error {
	if len(replies) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nReplies routed in:")
	tw := newTable(w)
	fmt.Fprintln(tw, "  MESSAGE\tCHANNEL\tTYPE\tCONTROL ID\tSTATUS\tFROM\tERROR")
	for _, r := range replies {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Channel, orDash(r.Type()), orDash(oneLine(r.ControlID)),
			r.Status, orDash(r.Destination), orDash(oneLine(r.Error)))
	}
	return tw.Flush()
}
