package hl7

import (
	"strconv"
	"strings"
)

// Path addresses an element of a message, written the way HL7 documentation
// does:
//
//	PID-3        field 3 of the first PID, all repetitions
//	PID-3[2]     the second repetition of that field
//	PID-3.1      component 1 of the first repetition
//	PID-3[2].1   component 1 of the second repetition
//	PID-3.1.2    subcomponent 2 of component 1
//	OBX(2)-5     field 5 of the second OBX segment
//
// All numbers are 1-based. MSH fields are numbered as HL7 numbers them:
// MSH-1 is the field separator, MSH-2 the encoding characters and MSH-3 the
// first field after them.
//
// The zero Path addresses nothing; get one from ParsePath.
type Path struct {
	segment    string
	occurrence int // 0 when not written, which means 1
	field      int
	repetition int // 0 when not written
	component  int // 0 when not written
	sub        int // 0 when not written
}

// maxIndex bounds every number in a path. Set pads a message up to the
// element it addresses, so an unbounded number would let one config line
// allocate without limit; nothing in real HL7 comes near this.
const maxIndex = 9999

// PathError reports a path that does not parse. Paths come from
// configuration, not messages, so the error quotes the path.
type PathError struct {
	Path   string
	Reason string
}

func (e *PathError) Error() string {
	return "hl7 path " + strconv.Quote(e.Path) + ": " + e.Reason
}

// ParsePath parses a path such as "PID-3[2].1" (see Path).
func ParsePath(s string) (Path, error) {
	fail := func(reason string) (Path, error) {
		return Path{}, &PathError{Path: s, Reason: reason}
	}
	if s == "" {
		return fail("empty path")
	}
	if len(s) < 3 || !isSegmentID(s[:3]) {
		return fail("segment id must be 3 uppercase letters or digits, starting with a letter")
	}
	p := Path{segment: s[:3]}
	rest := s[3:]

	// number reads a 1-based index at the start of rest.
	number := func(what string) (int, bool, string) {
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 {
			return 0, false, what + " must be a number"
		}
		v, err := strconv.Atoi(rest[:n])
		if err != nil || v > maxIndex {
			return 0, false, what + " must be at most " + strconv.Itoa(maxIndex)
		}
		if v < 1 {
			return 0, false, what + " must be at least 1"
		}
		rest = rest[n:]
		return v, true, ""
	}
	// bracketed reads "(n)" or "[n]" if rest starts with open.
	bracketed := func(open, closing byte, what string) (int, string) {
		if rest == "" || rest[0] != open {
			return 0, ""
		}
		rest = rest[1:]
		v, ok, reason := number(what)
		if !ok {
			return 0, reason
		}
		if rest == "" || rest[0] != closing {
			return 0, what + " is missing its closing " + strconv.QuoteRune(rune(closing))
		}
		rest = rest[1:]
		return v, ""
	}

	var reason string
	if p.occurrence, reason = bracketed('(', ')', "segment occurrence"); reason != "" {
		return fail(reason)
	}
	if rest == "" || rest[0] != '-' {
		return fail("expected '-' and a field number after the segment")
	}
	rest = rest[1:]
	var ok bool
	if p.field, ok, reason = number("field"); !ok {
		return fail(reason)
	}
	if p.repetition, reason = bracketed('[', ']', "repetition"); reason != "" {
		return fail(reason)
	}
	if strings.HasPrefix(rest, ".") {
		rest = rest[1:]
		if p.component, ok, reason = number("component"); !ok {
			return fail(reason)
		}
		if strings.HasPrefix(rest, ".") {
			rest = rest[1:]
			if p.sub, ok, reason = number("subcomponent"); !ok {
				return fail(reason)
			}
		}
	}
	if rest != "" {
		if rest[0] == '.' {
			return fail("too many levels: a path ends at field.component.subcomponent")
		}
		return fail("unexpected text after the path at offset " + strconv.Itoa(len(s)-len(rest)))
	}
	return p, nil
}

func isSegmentID(s string) bool {
	if len(s) != 3 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < 3; i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// String returns p in the syntax ParsePath accepts.
func (p Path) String() string {
	if p.IsZero() {
		return ""
	}
	var b strings.Builder
	b.WriteString(p.segment)
	if p.occurrence > 0 {
		b.WriteString("(" + strconv.Itoa(p.occurrence) + ")")
	}
	b.WriteString("-" + strconv.Itoa(p.field))
	if p.repetition > 0 {
		b.WriteString("[" + strconv.Itoa(p.repetition) + "]")
	}
	if p.component > 0 {
		b.WriteString("." + strconv.Itoa(p.component))
	}
	if p.sub > 0 {
		b.WriteString("." + strconv.Itoa(p.sub))
	}
	return b.String()
}

// IsZero reports whether p is the zero Path, which addresses nothing.
func (p Path) IsZero() bool { return p.field == 0 }

// ReadOnly reports whether Set, Clear and Copy refuse p as a target: MSH-1
// and MSH-2 hold the delimiters, and a message has exactly one MSH.
func (p Path) ReadOnly() bool {
	return p.segment == "MSH" && (p.field <= 2 || p.occurrence > 1)
}

// level is how deep a path reaches into a field.
type level int

const (
	levelField        level = iota // the whole field, every repetition
	levelRepetition                // one repetition
	levelComponent                 // one component of one repetition
	levelSubcomponent              // one subcomponent
)

func (p Path) level() level {
	switch {
	case p.sub > 0:
		return levelSubcomponent
	case p.component > 0:
		return levelComponent
	case p.repetition > 0:
		return levelRepetition
	}
	return levelField
}

// delimiterField reports whether p addresses MSH-1 or MSH-2, whose content
// is a literal and not split on the delimiters it declares.
func (p Path) delimiterField() bool {
	return p.segment == "MSH" && p.field <= 2 && p.occurrence <= 1
}

func max1(n int) int { return max(n, 1) }
