package hl7

import (
	"strconv"
	"strings"
	"time"
)

// AckCode is an acknowledgment code (MSA-1).
type AckCode string

// Original-mode codes answer for the receiving application; enhanced-mode
// commit codes answer only for safe receipt.
const (
	AckAccept       AckCode = "AA"
	AckError        AckCode = "AE"
	AckReject       AckCode = "AR"
	AckCommitAccept AckCode = "CA"
	AckCommitError  AckCode = "CE"
	AckCommitReject AckCode = "CR"
)

// Valid reports whether c is one of the six codes HL7 defines.
func (c AckCode) Valid() bool {
	switch c {
	case AckAccept, AckError, AckReject, AckCommitAccept, AckCommitError, AckCommitReject:
		return true
	}
	return false
}

// IsAccept reports whether c is AA or CA: the receiver took the message.
func (c AckCode) IsAccept() bool { return c == AckAccept || c == AckCommitAccept }

// IsError reports whether c is AE or CE: the receiver failed to process the
// message, and sending it again may succeed.
func (c AckCode) IsError() bool { return c == AckError || c == AckCommitError }

// IsReject reports whether c is AR or CR: the receiver refuses the message,
// and sending it again will not help.
func (c AckCode) IsReject() bool { return c == AckReject || c == AckCommitReject }

// Ack is the part of an acknowledgment a sender acts on.
type Ack struct {
	Code AckCode

	// ControlID is MSA-2, the control id of the acknowledged message.
	ControlID string

	// Text is the receiver's explanation: MSA-3, or for receivers that follow
	// v2.5+ and leave MSA-3 empty, ERR-8, ERR-3.2 or ERR-1.4.2. It comes from
	// the remote system and may quote PHI; treat it as content.
	Text string
}

// ParseACK parses an acknowledgment and returns its MSA. It does not insist
// on MSH-9 being ACK: application acknowledgments of other types (ORL, RSP,
// ...) carry an MSA too.
//
// Errors are *ParseError values: those of Parse, or ErrNoMSA, or
// ErrBadAckCode when MSA-1 is not one of the six codes.
func ParseACK(raw []byte) (Ack, error) {
	m, err := Parse(raw)
	if err != nil {
		return Ack{}, err
	}
	i := m.findSegment("MSA", 1)
	if i < 0 {
		return Ack{}, &ParseError{Kind: ErrNoMSA, Offset: -1}
	}
	ack := Ack{
		Code:      AckCode(m.Get("MSA-1")),
		ControlID: m.Get("MSA-2"),
	}
	if !ack.Code.Valid() {
		return Ack{}, &ParseError{Kind: ErrBadAckCode, Segment: i + 1, Offset: -1, Detail: "MSA-1 is not AA, AE, AR, CA, CE or CR"}
	}
	for _, p := range [...]string{"MSA-3", "ERR-8", "ERR-3.2", "ERR-1.4.2"} {
		if ack.Text = m.Get(p); ack.Text != "" {
			break
		}
	}
	return ack, nil
}

// NewACK builds the acknowledgment of orig: an MSH in orig's delimiters that
// swaps orig's sending and receiving application and facility and keeps its
// processing id (MSH-11) and version (MSH-12), and an MSA whose MSA-2 is
// orig's control id. MSH-7 is now as YYYYMMDDHHMMSS in now's location, MSH-9
// is ACK^<orig's trigger>^ACK and MSH-10 is controlID (see NewControlID).
//
// text, if not empty, goes into MSA-3 (escaped). For the error and reject
// codes an ERR segment is added, in the form orig's version expects, with
// text as the user message. The text must not quote message content: it
// goes back over the wire and into the sender's logs.
//
// A nil orig is treated like input whose MSH could not be read.
func NewACK(orig *Message, code AckCode, text, controlID string, now time.Time) []byte {
	if orig == nil || len(orig.segments) == 0 {
		return buildACK(DefaultDelimiters(), nil, code, text, controlID, now)
	}
	return buildACK(orig.delims, orig.segments[0], code, text, controlID, now)
}

// NewACKForUnparsed is NewACK for input Parse rejected. It uses the MSH of
// raw if its first line is a usable MSH (even if a later segment is
// broken); otherwise it answers with the default delimiters, empty header
// fields and an empty MSA-2, which is the best a sender can be told.
func NewACKForUnparsed(raw []byte, code AckCode, text, controlID string, now time.Time) []byte {
	s := raw[leadingJunk(raw):]
	if i := strings.IndexAny(string(s), "\r\n"); i >= 0 {
		s = s[:i]
	}
	if d, msh, err := parseMSH(string(s), 0); err == nil {
		return buildACK(d, msh, code, text, controlID, now)
	}
	return buildACK(DefaultDelimiters(), nil, code, text, controlID, now)
}

// buildACK writes the acknowledgment. Fields taken from the original MSH are
// copied in encoded form, which is valid as is because the ACK uses the same
// delimiters.
func buildACK(d Delimiters, msh segment, code AckCode, text, controlID string, now time.Time) []byte {
	field := func(n int) string {
		if n < len(msh) {
			return msh[n]
		}
		return ""
	}
	msgType := "ACK"
	if trigger, _ := nth(field(9), d.Repetition, 1); trigger != "" {
		if trigger, _ = nth(trigger, d.Component, 2); trigger != "" {
			msgType += string(d.Component) + trigger + string(d.Component) + "ACK"
		}
	}

	var b strings.Builder
	sep := func(s string) {
		b.WriteByte(d.Field)
		b.WriteString(s)
	}
	b.WriteString("MSH")
	sep(d.EncodingCharacters())
	sep(field(5)) // MSH-3 sending application: the original's receiver
	sep(field(6)) // MSH-4
	sep(field(3)) // MSH-5 receiving application: the original's sender
	sep(field(4)) // MSH-6
	sep(now.Format("20060102150405"))
	sep("") // MSH-8 security
	sep(msgType)
	sep(d.EscapeValue(controlID))
	sep(field(11))
	sep(field(12))
	b.WriteByte('\r')

	b.WriteString("MSA")
	sep(d.EscapeValue(string(code)))
	sep(field(10))
	if text != "" {
		sep(d.EscapeValue(text))
	}
	b.WriteByte('\r')

	if code.IsError() || code.IsReject() {
		writeERR(&b, d, field(12), text)
	}
	return []byte(b.String())
}

// writeERR writes an ERR segment reporting HL7 error 207 (application
// internal error), the one code that fits every failure the engine reports.
// v2.5 moved the error code from ERR-1 to ERR-3 and added severity and a
// user message; older receivers would not find them there.
func writeERR(b *strings.Builder, d Delimiters, version, text string) {
	c, s := string(d.Component), string(d.Subcomponent)
	v, _ := nth(version, d.Repetition, 1)
	v, _ = nth(v, d.Component, 1)
	b.WriteString("ERR")
	b.WriteByte(d.Field)
	if !versionBefore25(v) {
		// ERR-3 code, ERR-4 severity, ERR-8 user message.
		f := string(d.Field)
		b.WriteString(f + f + "207" + c + "Application internal error" + c + "HL70357" + f + "E")
		if text != "" {
			b.WriteString(f + f + f + f + d.EscapeValue(text))
		}
	} else {
		// ERR-1 ELD: segment^sequence^field^code as a CE in subcomponents.
		b.WriteString(c + c + c + "207" + s + "Application internal error" + s + "HL70357")
	}
	b.WriteByte('\r')
}

// versionBefore25 reports whether the HL7 version v predates 2.5. An empty
// or unrecognised version counts as modern.
func versionBefore25(v string) bool {
	rest, ok := strings.CutPrefix(v, "2.")
	if !ok {
		return false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	minor, err := strconv.Atoi(rest[:n])
	return err == nil && minor < 5
}
