package hl7

// Message is a parsed HL7 v2 message. Get one from Parse; the zero Message
// has no MSH, reads as empty and refuses edits.
//
// A Message is not safe for concurrent use if any goroutine edits it. Clone
// it to hand a private copy to code that edits.
type Message struct {
	delims   Delimiters
	segments []segment
}

// segment holds a segment's fields in encoded form. Index 0 is the segment
// id and index n is field n, so HL7 numbering applies directly. For MSH,
// index 1 is the field separator and index 2 the encoding characters (both
// literal), which gives MSH the same direct numbering.
type segment []string

// Delimiters returns the delimiters the message declared.
func (m *Message) Delimiters() Delimiters { return m.delims }

// Count returns how many segments with the id seg the message has.
func (m *Message) Count(seg string) int {
	n := 0
	for _, s := range m.segments {
		if s[0] == seg {
			n++
		}
	}
	return n
}

// SegmentIDs returns the ids of the message's segments in order, e.g. to
// check a message's structure. Segment ids are not content.
func (m *Message) SegmentIDs() []string {
	ids := make([]string, len(m.segments))
	for i, s := range m.segments {
		ids[i] = s[0]
	}
	return ids
}

// Clone returns a deep copy of m: edits to either leave the other alone.
func (m *Message) Clone() *Message {
	c := &Message{delims: m.delims, segments: make([]segment, len(m.segments))}
	for i, s := range m.segments {
		c.segments[i] = append(segment(nil), s...)
	}
	return c
}

// Encode serializes m with its own delimiters, ending every segment with CR
// as HL7 requires. Parse followed by Encode reproduces a well-formed,
// CR-terminated message byte for byte.
func (m *Message) Encode() []byte {
	n := 0
	for _, s := range m.segments {
		for _, f := range s {
			n += len(f) + 1
		}
	}
	out := make([]byte, 0, n)
	sep := m.delims.Field
	for i, s := range m.segments {
		fields := s[1:]
		out = append(out, s[0]...)
		if i == 0 && s[0] == "MSH" {
			// MSH-1 is the separator itself: it is written once, not as
			// a field followed by a separator.
			out = append(out, sep)
			out = append(out, s[2]...)
			fields = s[3:]
		}
		for _, f := range fields {
			out = append(out, sep)
			out = append(out, f...)
		}
		out = append(out, '\r')
	}
	return out
}

// findSegment returns the index of the occurrence'th (1-based) segment with
// the id seg, or -1 if there are fewer.
func (m *Message) findSegment(seg string, occurrence int) int {
	for i, s := range m.segments {
		if s[0] == seg {
			occurrence--
			if occurrence == 0 {
				return i
			}
		}
	}
	return -1
}
