package hl7

import "bytes"

// SplitMessages splits the content of an HL7 file into messages. Files in
// the wild separate segments with \r (as on the wire), \n or \r\n, and
// messages with blank lines or nothing at all; every segment that starts
// with MSH begins a new message. Blank lines are dropped and segments are
// re-joined with \r. Content before the first MSH is kept as its own
// (malformed) message so that nothing in the file is silently skipped.
func SplitMessages(data []byte) [][]byte {
	var (
		msgs [][]byte
		cur  []byte
	)
	flush := func() {
		if len(cur) > 0 {
			msgs = append(msgs, cur)
			cur = nil
		}
	}
	for seg, rest := nextSegment(data); seg != nil; seg, rest = nextSegment(rest) {
		if bytes.HasPrefix(seg, []byte("MSH")) {
			flush()
		}
		cur = append(cur, seg...)
		cur = append(cur, '\r')
	}
	flush()
	return msgs
}

// nextSegment cuts the first segment that is not blank off data, whether
// \r, \n or \r\n ends it, and returns it with what follows; seg is nil
// when no segment is left.
func nextSegment(data []byte) (seg, rest []byte) {
	for len(data) > 0 {
		if i := bytes.IndexAny(data, "\r\n"); i < 0 {
			seg, data = data, nil
		} else {
			seg, data = data[:i], data[i+1:]
		}
		if len(bytes.TrimSpace(seg)) > 0 {
			return seg, data
		}
	}
	return nil, nil
}
