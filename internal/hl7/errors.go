package hl7

import (
	"errors"
	"strconv"
	"strings"
)

// Kinds of ParseError. Test for them with errors.Is; a *ParseError unwraps to
// its Kind.
var (
	// ErrEmpty means the input held nothing but whitespace.
	ErrEmpty = errors.New("hl7: empty message")

	// ErrNoMSH means the first segment is not MSH.
	ErrNoMSH = errors.New("hl7: message does not start with an MSH segment")

	// ErrBadDelimiters means MSH-1 or MSH-2 do not declare a usable set of
	// distinct delimiters.
	ErrBadDelimiters = errors.New("hl7: bad delimiters")

	// ErrTruncated means the MSH segment ends before its delimiters are
	// complete.
	ErrTruncated = errors.New("hl7: truncated MSH segment")

	// ErrBadSegment means a line is not a segment: its id is not three
	// letters or digits followed by the field separator, or it is a second
	// MSH (batches are not supported).
	ErrBadSegment = errors.New("hl7: bad segment")

	// ErrNoMSA means an acknowledgment has no MSA segment.
	ErrNoMSA = errors.New("hl7: acknowledgment has no MSA segment")

	// ErrBadAckCode means MSA-1 is not one of AA, AE, AR, CA, CE, CR.
	ErrBadAckCode = errors.New("hl7: unknown acknowledgment code")
)

// ErrReadOnly is returned when Set, Clear or Copy target MSH-1 or MSH-2:
// they declare the delimiters every other field is encoded with, so changing
// them in place would silently corrupt the message.
var ErrReadOnly = errors.New("hl7: MSH-1 and MSH-2 cannot be changed")

// ParseError describes why input is not an HL7 message. It never includes
// message content: Detail is a fixed description, and the location is given
// as positions only.
type ParseError struct {
	// Kind is one of the Err* sentinels of this package.
	Kind error

	// Segment is the 1-based number of the offending segment, counting
	// non-empty lines, or 0 when the problem is not tied to one segment.
	Segment int

	// Offset is the byte offset into the input where the problem was found,
	// or -1 when unknown.
	Offset int

	// Detail says what exactly is wrong, without quoting content.
	Detail string
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Segment > 0 || e.Offset >= 0 {
		b.WriteString(" (")
		if e.Segment > 0 {
			b.WriteString("segment ")
			b.WriteString(strconv.Itoa(e.Segment))
		}
		if e.Offset >= 0 {
			if e.Segment > 0 {
				b.WriteString(", ")
			}
			b.WriteString("byte ")
			b.WriteString(strconv.Itoa(e.Offset))
		}
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap lets errors.Is match the Kind.
func (e *ParseError) Unwrap() error { return e.Kind }
