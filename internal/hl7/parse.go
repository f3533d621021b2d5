package hl7

import (
	"bytes"
	"strings"
)

// Parse parses one HL7 v2 message.
//
// Segments may end with CR, LF or CRLF, mixed freely. Empty or
// whitespace-only lines are skipped wherever they occur, and so are a UTF-8
// byte order mark and whitespace before MSH: senders and file drops produce
// these often enough, and they carry no meaning, so rejecting the message
// would only make work for someone. Anything else that is not a segment is
// an error rather than being guessed at.
//
// The returned message does not share memory with raw.
//
// Errors are *ParseError values whose Kind is ErrEmpty, ErrNoMSH,
// ErrBadDelimiters, ErrTruncated or ErrBadSegment.
func Parse(raw []byte) (*Message, error) {
	start := leadingJunk(raw)
	if start == len(raw) {
		return nil, &ParseError{Kind: ErrEmpty, Offset: -1}
	}
	s := string(raw[start:])

	m := &Message{segments: make([]segment, 0, strings.Count(s, "\r")+strings.Count(s, "\n")+1)}
	segNum := 0
	for pos := 0; pos < len(s); {
		end := strings.IndexAny(s[pos:], "\r\n")
		if end < 0 {
			end = len(s)
		} else {
			end += pos
		}
		line, off := s[pos:end], start+pos
		pos = end + 1
		if isBlank(line) {
			continue
		}
		segNum++

		if segNum == 1 {
			d, seg, perr := parseMSH(line, off)
			if perr != nil {
				return nil, perr
			}
			m.delims = d
			m.segments = append(m.segments, seg)
			continue
		}
		seg, detail := parseSegment(line, m.delims.Field)
		if detail != "" {
			return nil, &ParseError{Kind: ErrBadSegment, Segment: segNum, Offset: off, Detail: detail}
		}
		m.segments = append(m.segments, seg)
	}
	return m, nil
}

// leadingJunk returns how many bytes of BOM and whitespace precede the
// message proper.
func leadingJunk(raw []byte) int {
	i := 0
	if bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")) {
		i = 3
	}
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func isBlank(line string) bool {
	for i := 0; i < len(line); i++ {
		if !isSpace(line[i]) {
			return false
		}
	}
	return true
}

// parseMSH parses the first segment, which declares the delimiters. off is
// the segment's byte offset in the input, for errors.
func parseMSH(line string, off int) (Delimiters, segment, *ParseError) {
	fail := func(kind error, at int, detail string) (Delimiters, segment, *ParseError) {
		return Delimiters{}, nil, &ParseError{Kind: kind, Segment: 1, Offset: off + at, Detail: detail}
	}
	if !strings.HasPrefix(line, "MSH") {
		if len(line) < 3 && strings.HasPrefix("MSH", line) {
			return fail(ErrTruncated, len(line), "input ends inside the MSH segment id")
		}
		return fail(ErrNoMSH, 0, "")
	}
	if len(line) < 4 {
		return fail(ErrTruncated, len(line), "MSH segment ends before the field separator")
	}
	d := Delimiters{Field: line[3]}
	if !validDelimiter(d.Field) {
		return fail(ErrBadDelimiters, 3, delimiterNames[0]+" is not a printable, non-alphanumeric ASCII character")
	}
	rest := line[4:]
	enc, fields, more := strings.Cut(rest, string(d.Field))
	switch {
	case !more && len(enc) < 4:
		return fail(ErrTruncated, len(line), "MSH segment ends before the 4 encoding characters of MSH-2")
	case len(enc) != 4 && len(enc) != 5:
		return fail(ErrBadDelimiters, 4, "MSH-2 must hold 4 encoding characters, or 5 with the v2.7 truncation character")
	}
	d.Component, d.Repetition, d.Escape, d.Subcomponent = enc[0], enc[1], enc[2], enc[3]
	if len(enc) == 5 {
		d.Truncation = enc[4]
	}
	if at, p := d.problem(); p != "" {
		return fail(ErrBadDelimiters, 3+at, p)
	}

	n := 3
	if more {
		n += strings.Count(fields, string(d.Field)) + 1
	}
	seg := make(segment, 3, n)
	seg[0], seg[1], seg[2] = "MSH", line[3:4], enc
	if more {
		seg = splitInto(seg, fields, d.Field)
	}
	return d, seg, nil
}

// parseSegment splits a non-MSH segment into its id and fields. It returns a
// description of the problem if line is not a segment; the description never
// quotes the line, since a line that is not a segment is most likely part of
// a value that contained a line break.
func parseSegment(line string, sep byte) (segment, string) {
	if len(line) < 3 || !isAlnum(line[0]) || !isAlnum(line[1]) || !isAlnum(line[2]) {
		return nil, "segment id must be 3 letters or digits"
	}
	if len(line) > 3 && line[3] != sep {
		return nil, "segment id is not followed by the field separator"
	}
	if line[:3] == "MSH" {
		return nil, "second MSH segment: batched messages are not supported"
	}
	seg := make(segment, 0, strings.Count(line, string(sep))+1)
	return splitInto(seg, line, sep), ""
}

// splitInto appends the sep-separated parts of s to seg.
func splitInto(seg segment, s string, sep byte) segment {
	for {
		i := strings.IndexByte(s, sep)
		if i < 0 {
			return append(seg, s)
		}
		seg = append(seg, s[:i])
		s = s[i+1:]
	}
}
