package hl7

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// ErrBatch means a file's batch envelope (FHS, BHS, BTS, FTS) is not
// consistent: a trailer counts other messages or batches than the file
// holds (a file cut short, most often), a header is out of place, or a
// segment stands outside any message.
var ErrBatch = errors.New("hl7: not a well-formed file of HL7 messages")

// BatchError describes why a file is not a well-formed series of messages.
// Like ParseError it never quotes content: Detail is a fixed description
// and Segment a position (counting non-blank lines from 1).
type BatchError struct {
	Segment int
	Detail  string
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("%v: %s (segment %d)", ErrBatch, e.Detail, e.Segment)
}

// Unwrap lets errors.Is match ErrBatch.
func (e *BatchError) Unwrap() error { return ErrBatch }

// SplitFile splits the content of a file into its messages, in file order.
// Segments may end in \r, \n or \r\n, and blank lines are dropped; each MSH
// starts a message, whose segments are re-joined with \r. Batch envelopes
// are unwrapped: FHS and BHS headers and BTS and FTS trailers are not part
// of any message, and a trailer's count (BTS-1: messages in the batch,
// FTS-1: batches in the file), when given, must match what the file holds,
// which catches a file cut short at a message boundary. Anything else
// outside a message is an error, as is a file with no message: a file is
// taken whole or not at all, so nothing in it is silently skipped.
func SplitFile(data []byte) ([][]byte, error) {
	var (
		msgs      [][]byte
		cur       []byte
		n         int // segments seen
		inBatch   bool
		batchMsgs int // messages since the batch header
		batches   int
		fileOpen  bool // FHS seen, FTS not yet
		closed    bool // FTS seen
	)
	flush := func() {
		if len(cur) > 0 {
			msgs = append(msgs, cur)
			batchMsgs++
			cur = nil
		}
	}
	for seg, rest := nextSegment(data); seg != nil; seg, rest = nextSegment(rest) {
		n++
		if closed {
			return nil, &BatchError{Segment: n, Detail: "content after the file trailer (FTS)"}
		}
		id := segmentID(seg)
		switch id {
		case "MSH":
			flush()
			cur = append(cur, seg...)
			cur = append(cur, '\r')
		case "FHS":
			if n != 1 {
				return nil, &BatchError{Segment: n, Detail: "file header (FHS) is not the first segment"}
			}
			fileOpen = true
		case "BHS":
			flush()
			if inBatch {
				return nil, &BatchError{Segment: n, Detail: "batch header (BHS) inside a batch with no trailer (BTS)"}
			}
			inBatch, batchMsgs = true, 0
		case "BTS":
			flush()
			if want, ok := count(seg); ok && want != batchMsgs {
				return nil, &BatchError{Segment: n, Detail: fmt.Sprintf("batch trailer (BTS) counts %d messages, the batch holds %d", want, batchMsgs)}
			}
			inBatch, batchMsgs = false, 0
			batches++
		case "FTS":
			flush()
			if inBatch {
				return nil, &BatchError{Segment: n, Detail: "file trailer (FTS) inside a batch with no trailer (BTS)"}
			}
			if want, ok := count(seg); ok && want != batches {
				return nil, &BatchError{Segment: n, Detail: fmt.Sprintf("file trailer (FTS) counts %d batches, the file holds %d", want, batches)}
			}
			if !fileOpen {
				return nil, &BatchError{Segment: n, Detail: "file trailer (FTS) without a file header (FHS)"}
			}
			closed = true
		default:
			if len(cur) == 0 {
				return nil, &BatchError{Segment: n, Detail: "segment outside any message (before its MSH)"}
			}
			cur = append(cur, seg...)
			cur = append(cur, '\r')
		}
	}
	flush()
	if inBatch {
		return nil, &BatchError{Segment: n, Detail: "batch header (BHS) without its trailer (BTS): the file may be cut short"}
	}
	if fileOpen && !closed {
		return nil, &BatchError{Segment: n, Detail: "file header (FHS) without its trailer (FTS): the file may be cut short"}
	}
	if len(msgs) == 0 {
		return nil, &BatchError{Segment: n, Detail: "no message (no MSH segment) in the file"}
	}
	return msgs, nil
}

// segmentID returns the segment's three-character id when it is followed
// by a field separator (or ends there), else "".
func segmentID(seg []byte) string {
	if len(seg) < 3 || (len(seg) > 3 && isAlnum(seg[3])) {
		return ""
	}
	return string(seg[:3])
}

// count reads field 1 of a trailer (BTS-1, FTS-1): ok is false when the
// field is empty or not a number, which leaves the count unchecked.
func count(seg []byte) (int, bool) {
	if len(seg) < 5 {
		return 0, false
	}
	fields := bytes.Split(seg[4:], seg[3:4])
	v, err := strconv.Atoi(string(bytes.TrimSpace(fields[0])))
	if err != nil || v < 0 {
		return 0, false
	}
	return v, true
}
