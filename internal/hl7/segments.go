package hl7

import (
	"errors"
	"fmt"
	"strings"
)

// Segment-level edits: the ones a field path cannot express, such as
// dropping every NTE or adding a Z-segment after the second OBX.

// SegmentIndex returns the position (0-based, among all segments) of the
// occurrence'th (1-based) segment with the id seg, or -1 if there are fewer.
func (m *Message) SegmentIndex(seg string, occurrence int) int {
	return m.findSegment(seg, max1(occurrence))
}

// SegmentText returns the segment at position i in encoded form, without
// its CR: what the wire carries for that segment.
func (m *Message) SegmentText(i int) string {
	if i < 0 || i >= len(m.segments) {
		return ""
	}
	s := m.segments[i]
	fields := s[1:]
	var b strings.Builder
	b.WriteString(s[0])
	if i == 0 && s[0] == "MSH" {
		b.WriteByte(m.delims.Field)
		b.WriteString(s[2])
		fields = s[3:]
	}
	for _, f := range fields {
		b.WriteByte(m.delims.Field)
		b.WriteString(f)
	}
	return b.String()
}

// RemoveSegments removes the occurrence'th (1-based) segment with the id
// seg, or every one of them when occurrence is 0, and returns how many it
// removed. The MSH cannot be removed: it declares the delimiters.
func (m *Message) RemoveSegments(seg string, occurrence int) (int, error) {
	if seg == "MSH" {
		return 0, errors.New("hl7: the MSH segment cannot be removed")
	}
	kept := m.segments[:0:0]
	removed, n := 0, 0
	for _, s := range m.segments {
		if s[0] == seg {
			n++
			if occurrence == 0 || n == occurrence {
				removed++
				continue
			}
		}
		kept = append(kept, s)
	}
	if removed > 0 {
		m.segments = kept
	}
	return removed, nil
}

// InsertSegment parses text as one segment written with the message's own
// delimiters (so "ZVC|1|A^B" has two components in field 2) and inserts it
// at position at, counting from 0; at = SegmentCount() appends it. text must
// not contain a segment terminator and must not be an MSH.
func (m *Message) InsertSegment(at int, text string) error {
	if len(m.segments) == 0 {
		return errNoHeader
	}
	if at < 1 || at > len(m.segments) {
		return fmt.Errorf("hl7: cannot insert a segment at position %d of %d (the MSH stays first)", at, len(m.segments))
	}
	if strings.ContainsAny(text, "\r\n") {
		return errors.New("hl7: a segment's text cannot contain CR or LF; add one segment per call")
	}
	seg, detail := parseSegment(text, m.delims.Field)
	if detail != "" {
		return errors.New("hl7: not a segment: " + detail)
	}
	m.segments = append(m.segments, nil)
	copy(m.segments[at+1:], m.segments[at:])
	m.segments[at] = seg
	return nil
}

// SegmentCount returns how many segments the message has.
func (m *Message) SegmentCount() int { return len(m.segments) }
