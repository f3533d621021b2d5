package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// hl7Location is the part of an HL7 location that validation looks at.
type hl7Location struct {
	segment    string
	occurrence int // 0 when not written, which means 1
	field      int
}

// maxHL7Index bounds every number in a location, as internal/hl7 does: an
// edit pads the message up to the element it addresses.
const maxHL7Index = 9999

// parseHL7Path checks the syntax of an HL7 location and says what is wrong
// with it. A location is a segment ID, an optional segment occurrence, a
// field, an optional repetition, and optional component and subcomponent,
// all counted from 1:
//
//	PID-3   PID-3.1   PID-3.1.2   OBX(2)-5   PID-3[2].1
//
// The rules match internal/hl7's ParsePath, so that a location accepted here
// works there; this package doesn't import it so that loading a
// configuration doesn't depend on the HL7 engine. Errors also catch the
// usual slips, like PID.3 or lower-case segment IDs.
func parseHL7Path(s string) (hl7Location, error) {
	var loc hl7Location
	if s == "" {
		return loc, errors.New("is empty; write a segment and field such as PID-3.1")
	}
	if len(s) < 3 || !isSegmentID(s[:3]) {
		if len(s) >= 3 && isSegmentID(strings.ToUpper(s[:3])) {
			return loc, fmt.Errorf("segment IDs are upper case: %s", strings.ToUpper(s[:3])+s[3:])
		}
		return loc, errors.New("must start with a three-character segment ID such as PID or OBX")
	}
	loc.segment = s[:3]
	rest := s[3:]

	if strings.HasPrefix(rest, "(") {
		n, after, ok := number(rest[1:])
		if !ok || !strings.HasPrefix(after, ")") {
			return loc, fmt.Errorf("segment occurrence must be a number from 1 to %d in parentheses, e.g. %s(2)-5", maxHL7Index, loc.segment)
		}
		loc.occurrence, rest = n, after[1:]
	}
	head := s[:len(s)-len(rest)] // segment and occurrence

	switch {
	case rest == "":
		return loc, fmt.Errorf("names a segment but no field; add one, e.g. %s-3", s)
	case rest[0] == '.':
		return loc, fmt.Errorf("separate segment and field with '-', not '.': %s-%s", head, rest[1:])
	case rest[0] != '-':
		return loc, fmt.Errorf("expected '-' and a field number after %s, e.g. %s-3", head, head)
	}
	field, rest, ok := number(rest[1:])
	if !ok {
		return loc, fmt.Errorf("expected a field number from 1 to %d after '-', e.g. %s-3", maxHL7Index, head)
	}
	loc.field = field

	if strings.HasPrefix(rest, "[") {
		_, after, ok := number(rest[1:])
		if !ok || !strings.HasPrefix(after, "]") {
			return loc, fmt.Errorf("field repetition must be a number from 1 to %d in brackets, e.g. %s-%d[2]", maxHL7Index, head, field)
		}
		rest = after[1:]
	}

	for _, level := range []string{"component", "subcomponent"} {
		if rest == "" {
			return loc, nil
		}
		switch rest[0] {
		case '.':
		case '-':
			return loc, fmt.Errorf("use '.' between field and component, e.g. %s-%d.1", head, field)
		default:
			return loc, fmt.Errorf("unexpected %q", rest)
		}
		_, after, ok := number(rest[1:])
		if !ok {
			return loc, fmt.Errorf("%s must be a number from 1 to %d, e.g. PID-3.1.2", level, maxHL7Index)
		}
		rest = after
	}
	if rest != "" {
		return loc, fmt.Errorf("unexpected %q: a location goes no deeper than a subcomponent, e.g. PID-3.1.2", rest)
	}
	return loc, nil
}

// checkHL7Path is parseHL7Path for callers that only need to know whether
// the location is valid.
func checkHL7Path(s string) error {
	_, err := parseHL7Path(s)
	return err
}

// readOnly explains why loc can't be written, or returns "". MSH-1 and
// MSH-2 define the message's delimiters, and a message has exactly one MSH.
func (loc hl7Location) readOnly() string {
	switch {
	case loc.segment != "MSH":
		return ""
	case loc.occurrence > 1:
		return "a message has exactly one MSH segment"
	case loc.field <= 2:
		return "MSH-1 and MSH-2 define the message's delimiters"
	}
	return ""
}

// isSegmentID reports whether s is a segment ID: an upper-case letter
// followed by two upper-case letters or digits (PID, PV1, ZPD).
func isSegmentID(s string) bool {
	if len(s) != 3 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for _, c := range []byte(s[1:]) {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// number parses the 1-based index at the start of s.
func number(s string) (n int, rest string, ok bool) {
	i := 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	if i == 0 || i > 4 {
		return 0, s, false
	}
	n, _ = strconv.Atoi(s[:i])
	return n, s[i:], 1 <= n && n <= maxHL7Index
}
