package mllp

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// FuzzReadFrame checks that ReadFrame never panics, never returns more than
// the limit, always makes progress, and reads back what WriteFrame wrote.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte(frame("MSH|^~\\&|A|B")), uint16(0), uint8(0))
	f.Add([]byte("junk\r\n"+frame("one")+frame("two")), uint16(4), uint8(1))
	f.Add([]byte("\x0bMSH\x1cX"), uint16(100), uint8(2))
	f.Add([]byte("\x0b\x0b\x1c\x1c\x0d"), uint16(1), uint8(3))
	f.Add([]byte("\x0bunterminated"), uint16(3), uint8(200))

	f.Fuzz(func(t *testing.T, data []byte, maxSize uint16, mode uint8) {
		max := int(maxSize) // zero selects the default
		bufSize := 16 + int(mode>>1)%64
		newReader := func(b []byte) *Reader {
			var src io.Reader = bytes.NewReader(b)
			if mode&1 == 1 {
				src = iotest.OneByteReader(src)
			}
			return newReaderSize(src, max, bufSize)
		}

		// Arbitrary input as a stream.
		r := newReader(data)
		limit := r.MaxFrameSize()
		total := 0
		for range len(data) + 1 {
			msg, err := r.ReadFrame()
			if len(msg) > limit {
				t.Fatalf("ReadFrame returned %d bytes, limit %d", len(msg), limit)
			}
			total += len(msg)
			if err == nil {
				continue
			}
			if errors.Is(err, ErrFrameTooLarge) && len(msg) != limit {
				t.Fatalf("oversize prefix has %d bytes, want %d", len(msg), limit)
			}
			if !errors.Is(err, ErrFrameTooLarge) && msg != nil {
				t.Fatalf("ReadFrame returned bytes with error %v", err)
			}
			if err != io.EOF && err != io.ErrUnexpectedEOF &&
				!errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("unexpected error %v", err)
			}
			break
		}
		if total > len(data) {
			t.Fatalf("returned %d message bytes from %d input bytes", total, len(data))
		}

		// The input as a message: WriteFrame's output reads back unchanged.
		var buf bytes.Buffer
		err := WriteFrame(&buf, data)
		if bytes.IndexByte(data, endBlock) >= 0 {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("WriteFrame error = %v, want ErrInvalidMessage", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("WriteFrame: %v", err)
		}
		buf.WriteString("\r\n") // trailing bytes between frames are skipped
		r = newReader(buf.Bytes())
		msg, err := r.ReadFrame()
		if len(data) > limit {
			if !errors.Is(err, ErrFrameTooLarge) || !bytes.Equal(msg, data[:limit]) {
				t.Fatalf("oversize round trip: got %d bytes, error %v", len(msg), err)
			}
			return
		}
		if err != nil || !bytes.Equal(msg, data) {
			t.Fatalf("round trip: got %d bytes (error %v), want %d bytes", len(msg), err, len(data))
		}
		if _, err := r.ReadFrame(); err != io.EOF {
			t.Fatalf("after round trip: error %v, want io.EOF", err)
		}
	})
}
