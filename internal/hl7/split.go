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
	for len(data) > 0 {
		i := bytes.IndexAny(data, "\r\n")
		var seg []byte
		if i < 0 {
			seg, data = data, nil
		} else {
			seg, data = data[:i], data[i+1:]
		}
		if len(bytes.TrimSpace(seg)) == 0 {
			continue
		}
		if bytes.HasPrefix(seg, []byte("MSH")) {
			flush()
		}
		cur = append(cur, seg...)
		cur = append(cur, '\r')
	}
	flush()
	return msgs
}
