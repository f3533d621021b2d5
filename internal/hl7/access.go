package hl7

import (
	"errors"
	"fmt"
	"strings"
)

// errNoHeader is returned by edits on a Message that did not come from
// Parse: without an MSH there are no delimiters to encode with.
var errNoHeader = errors.New("hl7: message has no MSH segment")

// Get returns the decoded value at path, or "" if the message has no such
// element or path does not parse. Use it with literal paths; paths from
// configuration should go through ParsePath once and then GetPath.
func (m *Message) Get(path string) string {
	v, _ := m.Lookup(path)
	return v
}

// Lookup is Get that also reports whether the element exists. It reports
// false for a path that does not parse.
func (m *Message) Lookup(path string) (string, bool) {
	p, err := ParsePath(path)
	if err != nil {
		return "", false
	}
	return m.LookupPath(p)
}

// GetPath returns the decoded value at p, or "" if there is no such element.
func (m *Message) GetPath(p Path) string {
	v, _ := m.LookupPath(p)
	return v
}

// LookupPath returns the decoded value at p and whether the element exists.
// An element exists when the message reaches that far: in "A|B||D", field 3
// exists and is empty, field 5 does not exist.
//
// Addressing an element that has structure below it (a field with
// components, say) returns its text with the inner separators in place and
// escape sequences decoded. That is convenient to read but ambiguous if a
// value contains an escaped separator; address the leaf to get it exactly.
//
// MSH-1 and MSH-2 are returned literally: the field separator, and the
// encoding characters undecoded.
func (m *Message) LookupPath(p Path) (string, bool) {
	raw, ok := m.raw(p)
	if !ok {
		return "", false
	}
	if p.delimiterField() {
		return raw, true
	}
	return m.delims.UnescapeValue(raw), true
}

// raw returns the encoded text of the element at p.
func (m *Message) raw(p Path) (string, bool) {
	if p.IsZero() {
		return "", false
	}
	i := m.findSegment(p.segment, max1(p.occurrence))
	if i < 0 || p.field >= len(m.segments[i]) {
		return "", false
	}
	f := m.segments[i][p.field]
	if p.delimiterField() {
		if p.repetition > 1 || p.component > 1 || p.sub > 1 {
			return "", false
		}
		return f, true
	}
	if p.level() == levelField {
		return f, true
	}
	r, ok := nth(f, m.delims.Repetition, max1(p.repetition))
	if !ok || p.component == 0 {
		return r, ok
	}
	c, ok := nth(r, m.delims.Component, p.component)
	if !ok || p.sub == 0 {
		return c, ok
	}
	return nth(c, m.delims.Subcomponent, p.sub)
}

// nth returns the n'th (1-based) sep-separated part of s.
func nth(s string, sep byte, n int) (string, bool) {
	for ; n > 1; n-- {
		i := strings.IndexByte(s, sep)
		if i < 0 {
			return "", false
		}
		s = s[i+1:]
	}
	if i := strings.IndexByte(s, sep); i >= 0 {
		s = s[:i]
	}
	return s, true
}

// Set sets the element at path to value; see SetPath.
func (m *Message) Set(path, value string) error {
	p, err := ParsePath(path)
	if err != nil {
		return err
	}
	return m.SetPath(p, value)
}

// SetPath replaces the element at p with value, escaping any delimiters in
// it, so the element holds exactly value and whatever structure it had below
// is gone: setting PID-5 to "A^B" stores one component reading "A^B", not
// two components.
//
// Missing parts are created: fields, repetitions and components are padded
// with empty ones, and missing segments are appended to the end of the
// message (as many as needed to reach p's occurrence).
//
// SetPath returns ErrReadOnly for MSH-1 and MSH-2 and refuses to create a
// second MSH.
func (m *Message) SetPath(p Path, value string) error {
	if err := m.checkWritable(p); err != nil {
		return err
	}
	m.put(p, m.delims.EscapeValue(value))
	return nil
}

// Clear empties the element at path; see ClearPath.
func (m *Message) Clear(path string) error {
	p, err := ParsePath(path)
	if err != nil {
		return err
	}
	return m.ClearPath(p)
}

// ClearPath empties the element at p, keeping its position so later fields
// and components do not shift. Clearing an element that does not exist does
// nothing.
func (m *Message) ClearPath(p Path) error {
	if err := m.checkWritable(p); err != nil {
		return err
	}
	if _, ok := m.raw(p); ok {
		m.put(p, "")
	}
	return nil
}

// Copy replaces the element at to with the element at from, structure
// included: copying PID-5 to NK1-2 copies every component. When to is
// deeper than from's structure can fit (a whole field copied into one
// component, say), the separators that do not fit are escaped, so the
// target holds from's text literally. A from that does not exist reads as
// empty: the target is cleared.
func (m *Message) Copy(from, to Path) error {
	if err := m.checkWritable(to); err != nil {
		return err
	}
	if from.delimiterField() {
		// The delimiter fields are literals, not encoded text.
		v, ok := m.LookupPath(from)
		if !ok {
			return m.ClearPath(to)
		}
		return m.SetPath(to, v)
	}
	raw, ok := m.raw(from)
	if !ok {
		return m.ClearPath(to)
	}
	m.put(to, m.delims.flatten(raw, to.level()))
	return nil
}

func (m *Message) checkWritable(p Path) error {
	switch {
	case p.IsZero():
		return errors.New("hl7: zero Path addresses nothing")
	case len(m.segments) == 0:
		return errNoHeader
	case p.delimiterField():
		return ErrReadOnly
	case p.ReadOnly():
		return fmt.Errorf("hl7: %s: a message has exactly one MSH segment", p)
	}
	return nil
}

// put stores the encoded text raw at p, creating what is missing. raw must
// not contain separators that cannot appear at p's level.
func (m *Message) put(p Path, raw string) {
	occurrence := max1(p.occurrence)
	i := m.findSegment(p.segment, occurrence)
	if i < 0 {
		for n := m.Count(p.segment); n < occurrence; n++ {
			m.segments = append(m.segments, segment{p.segment})
		}
		i = len(m.segments) - 1
	}
	seg := m.segments[i]
	for len(seg) <= p.field {
		seg = append(seg, "")
	}
	seg[p.field] = m.delims.replace(seg[p.field], p, raw)
	m.segments[i] = seg
}

// replace returns field with the element p addresses inside it replaced by
// raw.
func (d Delimiters) replace(field string, p Path, raw string) string {
	if p.level() == levelField {
		return raw
	}
	return replaceNth(field, d.Repetition, max1(p.repetition), func(rep string) string {
		if p.component == 0 {
			return raw
		}
		return replaceNth(rep, d.Component, p.component, func(comp string) string {
			if p.sub == 0 {
				return raw
			}
			return replaceNth(comp, d.Subcomponent, p.sub, func(string) string { return raw })
		})
	})
}

// replaceNth returns s with its n'th (1-based) sep-separated part replaced
// by f of that part, padding s with empty parts if it has fewer than n.
func replaceNth(s string, sep byte, n int, f func(string) string) string {
	start := 0
	for k := 1; k < n; k++ {
		i := strings.IndexByte(s[start:], sep)
		if i < 0 {
			return s + strings.Repeat(string(sep), n-k) + f("")
		}
		start += i + 1
	}
	end := strings.IndexByte(s[start:], sep)
	if end < 0 {
		end = len(s)
	} else {
		end += start
	}
	return s[:start] + f(s[start:end]) + s[end:]
}
