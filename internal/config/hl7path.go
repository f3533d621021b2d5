package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// checkHL7Path reports what is wrong with an HL7 location, or nil if it is
// well formed. A location is a segment ID, an optional 1-based segment
// occurrence, a field, an optional repetition, and optional component and
// subcomponent:
//
//	PID-3   PID-3.1   PID-3.1.2   OBX(2)-5   PID-3[2].1
//
// Only syntax is checked: this package doesn't depend on the HL7 parser, and
// whether PID-3 makes sense for a message is up to the message.
func checkHL7Path(s string) error {
	if s == "" {
		return errors.New("is empty; write a segment and field such as PID-3.1")
	}
	if len(s) < 3 || !isSegmentID(s[:3]) {
		if len(s) >= 3 && isSegmentID(strings.ToUpper(s[:3])) {
			return fmt.Errorf("segment IDs are upper case: %s", strings.ToUpper(s[:3])+s[3:])
		}
		return errors.New("must start with a three-character segment ID such as PID or OBX")
	}
	seg, rest := s[:3], s[3:]

	if strings.HasPrefix(rest, "(") {
		n, after, ok := number(rest[1:])
		if !ok || !strings.HasPrefix(after, ")") || n < 1 {
			return fmt.Errorf("segment occurrence must be a number from 1 in parentheses, e.g. %s(2)-5", seg)
		}
		rest = after[1:]
	}

	switch {
	case rest == "":
		return fmt.Errorf("names a segment but no field; add one, e.g. %s-3", s)
	case rest[0] == '.':
		return fmt.Errorf("separate segment and field with '-', not '.': %s", s[:len(s)-len(rest)]+"-"+rest[1:])
	case rest[0] != '-':
		return fmt.Errorf("expected '-' and a field number after %s, e.g. %s-3", s[:len(s)-len(rest)], seg)
	}
	field, rest, ok := number(rest[1:])
	if !ok {
		return fmt.Errorf("expected a field number after '-', e.g. %s-3", seg)
	}
	if field < 1 {
		return errors.New("field numbers count from 1")
	}

	if strings.HasPrefix(rest, "[") {
		n, after, ok := number(rest[1:])
		if !ok || !strings.HasPrefix(after, "]") || n < 1 {
			return fmt.Errorf("field repetition must be a number from 1 in brackets, e.g. %s-%d[2]", seg, field)
		}
		rest = after[1:]
	}

	// Component, then subcomponent.
	for level := range 2 {
		if rest == "" {
			return nil
		}
		if rest[0] != '.' {
			if rest[0] == '-' {
				return fmt.Errorf("use '.' between field and component, e.g. %s-%d.1", seg, field)
			}
			return fmt.Errorf("unexpected %q", rest)
		}
		n, after, ok := number(rest[1:])
		if !ok || n < 1 {
			if level == 0 {
				return errors.New("component numbers count from 1, e.g. PID-3.1")
			}
			return errors.New("subcomponent numbers count from 1, e.g. PID-3.1.2")
		}
		rest = after
	}
	if rest != "" {
		return fmt.Errorf("unexpected %q: a location goes no deeper than a subcomponent, e.g. PID-3.1.2", rest)
	}
	return nil
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

// number parses the leading digits of s.
func number(s string) (n int, rest string, ok bool) {
	i := 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	if i == 0 || i > 6 { // no HL7 position needs more than six digits
		return 0, s, false
	}
	n, err := strconv.Atoi(s[:i])
	return n, s[i:], err == nil
}

// writesEncodingCharacters reports whether writing location s would change
// MSH-1 or MSH-2, which define the message's delimiters: editing them
// corrupts every segment after MSH.
func writesEncodingCharacters(s string) bool {
	s = strings.Replace(s, "MSH(1)-", "MSH-", 1)
	return s == "MSH-1" || s == "MSH-2" || strings.HasPrefix(s, "MSH-1.") || strings.HasPrefix(s, "MSH-2.") ||
		strings.HasPrefix(s, "MSH-1[") || strings.HasPrefix(s, "MSH-2[")
}
