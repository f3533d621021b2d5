package hl7

import (
	"encoding/hex"
	"strings"
)

// Delimiters are the separator and escape characters a message declares in
// MSH-1 (Field) and MSH-2 (the rest, in HL7's fixed order).
type Delimiters struct {
	Field        byte
	Component    byte
	Repetition   byte
	Escape       byte
	Subcomponent byte

	// Truncation is the v2.7 truncation character, the optional fifth
	// character of MSH-2, or 0 when the message declares none.
	Truncation byte
}

// DefaultDelimiters returns |^~\&, what HL7 recommends and nearly every
// sender uses. Acknowledgments for input whose own delimiters cannot be
// recovered use these.
func DefaultDelimiters() Delimiters {
	return Delimiters{Field: '|', Component: '^', Repetition: '~', Escape: '\\', Subcomponent: '&'}
}

// EncodingCharacters returns the MSH-2 literal for d.
func (d Delimiters) EncodingCharacters() string {
	b := []byte{d.Component, d.Repetition, d.Escape, d.Subcomponent}
	if d.Truncation != 0 {
		b = append(b, d.Truncation)
	}
	return string(b)
}

// problem returns why d is unusable, or "" if it is usable, and the index of
// the offending character in MSH-1 followed by MSH-2. The description names
// positions, not characters, so it is safe in errors.
func (d Delimiters) problem() (int, string) {
	all := []byte{d.Field, d.Component, d.Repetition, d.Escape, d.Subcomponent}
	if d.Truncation != 0 {
		all = append(all, d.Truncation)
	}
	for i, c := range all {
		if !validDelimiter(c) {
			return i, delimiterNames[i] + " is not a printable, non-alphanumeric ASCII character"
		}
		for j := range i {
			if all[j] == c {
				return i, delimiterNames[i] + " is the same character as the " + delimiterNames[j]
			}
		}
	}
	return 0, ""
}

var delimiterNames = [...]string{
	"field separator (MSH-1)",
	"component separator (MSH-2 position 1)",
	"repetition separator (MSH-2 position 2)",
	"escape character (MSH-2 position 3)",
	"subcomponent separator (MSH-2 position 4)",
	"truncation character (MSH-2 position 5)",
}

// validDelimiter reports whether c can delimit: HL7 allows any printable
// non-alphanumeric character, and a space or control character would be
// indistinguishable from data or from a segment terminator.
func validDelimiter(c byte) bool {
	return c > ' ' && c < 0x7f && !isAlnum(c)
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}

// EscapeValue encodes s so that it can be stored as a single value: delimiters
// become \F\ \S\ \R\ \T\ \E\ (and \P\ for a declared truncation character),
// and CR and LF, which would end the segment, become \X0D\ and \X0A\.
func (d Delimiters) EscapeValue(s string) string {
	if !d.needsEscape(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	esc := func(seq string) {
		b.WriteByte(d.Escape)
		b.WriteString(seq)
		b.WriteByte(d.Escape)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == d.Escape:
			esc("E")
		case c == d.Field:
			esc("F")
		case c == d.Component:
			esc("S")
		case c == d.Repetition:
			esc("R")
		case c == d.Subcomponent:
			esc("T")
		case d.Truncation != 0 && c == d.Truncation:
			esc("P")
		case c == '\r':
			esc("X0D")
		case c == '\n':
			esc("X0A")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func (d Delimiters) needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case d.Escape, d.Field, d.Component, d.Repetition, d.Subcomponent, '\r', '\n':
			return true
		default:
			if d.Truncation != 0 && c == d.Truncation {
				return true
			}
		}
	}
	return false
}

// UnescapeValue decodes the escape sequences in s. \F\ \S\ \R\ \T\ \E\ (and \P\
// when a truncation character is declared) become the delimiters they stand
// for and \Xhh...\ becomes the bytes hh.... Anything else — formatting
// sequences such as \H\ \N\ \.br\, character-set switches, malformed hex, an
// escape character without a closing one — is kept verbatim, because
// dropping it would lose information a downstream system may rely on.
func (d Delimiters) UnescapeValue(s string) string {
	i := strings.IndexByte(s, d.Escape)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i >= 0 {
		b.WriteString(s[:i])
		s = s[i:]
		j := strings.IndexByte(s[1:], d.Escape)
		if j < 0 {
			break // unterminated: the rest is kept verbatim below
		}
		seq, whole := s[1:1+j], s[:j+2]
		s = s[j+2:]
		if !d.decodeSequence(&b, seq) {
			b.WriteString(whole)
		}
		i = strings.IndexByte(s, d.Escape)
	}
	b.WriteString(s)
	return b.String()
}

// decodeSequence writes the decoding of the escape sequence seq (without its
// escape characters) to b and reports whether seq was one it decodes.
func (d Delimiters) decodeSequence(b *strings.Builder, seq string) bool {
	switch seq {
	case "F":
		b.WriteByte(d.Field)
	case "S":
		b.WriteByte(d.Component)
	case "R":
		b.WriteByte(d.Repetition)
	case "T":
		b.WriteByte(d.Subcomponent)
	case "E":
		b.WriteByte(d.Escape)
	case "P":
		if d.Truncation == 0 {
			return false
		}
		b.WriteByte(d.Truncation)
	default:
		if len(seq) < 3 || seq[0] != 'X' || len(seq)%2 == 0 {
			return false
		}
		raw, err := hex.DecodeString(seq[1:])
		if err != nil {
			return false
		}
		b.Write(raw)
	}
	return true
}

// flatten escapes the separators in the encoded text raw that cannot appear
// at level, so that structure copied from a higher level into a lower one
// becomes literal text instead of changing the shape of the target.
func (d Delimiters) flatten(raw string, lvl level) string {
	seqFor := func(c byte) string {
		switch {
		case lvl >= levelRepetition && c == d.Repetition:
			return "R"
		case lvl >= levelComponent && c == d.Component:
			return "S"
		case lvl >= levelSubcomponent && c == d.Subcomponent:
			return "T"
		}
		return ""
	}
	first := -1
	for i := 0; i < len(raw); i++ {
		if seqFor(raw[i]) != "" {
			first = i
			break
		}
	}
	if first < 0 {
		return raw
	}
	var b strings.Builder
	b.Grow(len(raw) + 8)
	b.WriteString(raw[:first])
	for i := first; i < len(raw); i++ {
		if seq := seqFor(raw[i]); seq != "" {
			b.WriteByte(d.Escape)
			b.WriteString(seq)
			b.WriteByte(d.Escape)
		} else {
			b.WriteByte(raw[i])
		}
	}
	return b.String()
}
