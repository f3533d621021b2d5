package mllp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func frame(msg string) string { return "\x0b" + msg + "\x1c\x0d" }

func TestReadFrame(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name      string
		stream    string
		max       int
		want      []string
		wantErr   error // error after the frames in want
		discarded int64
	}{
		{name: "single", stream: frame("MSH|a"), want: []string{"MSH|a"}, wantErr: io.EOF},
		{name: "several", stream: frame("one") + frame("two") + frame("three"), want: []string{"one", "two", "three"}, wantErr: io.EOF},
		{name: "empty stream", stream: "", wantErr: io.EOF},
		{name: "empty frame", stream: frame(""), want: []string{""}, wantErr: io.EOF},
		{name: "junk skipped", stream: "xx\r\n" + frame("one") + "\n" + frame("two") + "\r\n", want: []string{"one", "two"}, wantErr: io.EOF, discarded: 7},
		{name: "only junk", stream: "hello", wantErr: io.EOF, discarded: 5},
		{name: "start block inside message kept", stream: frame("a\x0bb"), want: []string{"a\x0bb"}, wantErr: io.EOF},
		{name: "eof inside message", stream: "\x0bMSH|partial", wantErr: io.ErrUnexpectedEOF},
		{name: "eof after start block", stream: "\x0b", wantErr: io.ErrUnexpectedEOF},
		{name: "eof after end block", stream: "\x0bMSH\x1c", wantErr: io.ErrUnexpectedEOF},
		{name: "end block without carriage return", stream: "\x0bMSH\x1cX", wantErr: ErrMalformedFrame},
		{name: "exactly max", stream: frame("12345"), max: 5, want: []string{"12345"}, wantErr: io.EOF},
		{name: "one over max", stream: frame("123456"), max: 5, want: []string{"12345"}, wantErr: ErrFrameTooLarge},
		{name: "over max without end", stream: "\x0b" + strings.Repeat("z", 100), max: 5, want: []string{"zzzzz"}, wantErr: ErrFrameTooLarge},
	}
	for _, tt := range tests {
		for _, bufSize := range []int{16, readBufferSize} {
			r := newReaderSize(strings.NewReader(tt.stream), tt.max, bufSize)
			var got []string
			var err error
			for {
				var msg []byte
				msg, err = r.ReadFrame()
				if msg != nil {
					got = append(got, string(msg))
				}
				if err != nil {
					break
				}
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("%s (buf %d): error = %v, want %v", tt.name, bufSize, err, tt.wantErr)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Errorf("%s (buf %d): frames = %q, want %q", tt.name, bufSize, got, tt.want)
			}
			if r.Discarded() != tt.discarded {
				t.Errorf("%s (buf %d): discarded = %d, want %d", tt.name, bufSize, r.Discarded(), tt.discarded)
			}
		}
	}
}

func TestReadFrameEmptyFrameIsNonNil(t *testing.T) {
	t.Parallel()
	msg, err := NewReader(strings.NewReader(frame("")), 0).ReadFrame()
	if err != nil || msg == nil || len(msg) != 0 {
		t.Fatalf("ReadFrame() = %v, %v; want empty non-nil slice", msg, err)
	}
}

func TestReadFrameDefaultMax(t *testing.T) {
	t.Parallel()
	if got := NewReader(strings.NewReader(""), 0).MaxFrameSize(); got != DefaultMaxFrameSize {
		t.Fatalf("MaxFrameSize() = %d, want %d", got, DefaultMaxFrameSize)
	}
}

// endlessReader is a frame that never ends, counting what has been read.
type endlessReader struct{ read int }

func (e *endlessReader) Read(p []byte) (int, error) {
	for i := range p {
		if e.read+i == 0 {
			p[i] = startBlock
		} else {
			p[i] = 'A'
		}
	}
	e.read += len(p)
	return len(p), nil
}

// An oversize frame must be rejected after reading about the limit, not
// after buffering whatever the sender cares to send.
func TestReadFrameOversizeStopsReading(t *testing.T) {
	t.Parallel()
	const max = 64 << 10
	src := &endlessReader{}
	msg, err := NewReader(src, max).ReadFrame()
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("error = %v, want ErrFrameTooLarge", err)
	}
	if len(msg) != max {
		t.Fatalf("prefix length = %d, want %d", len(msg), max)
	}
	if cap(msg) > 2*max {
		t.Errorf("prefix capacity = %d, want at most %d", cap(msg), 2*max)
	}
	if src.read > max+readBufferSize+1 {
		t.Errorf("read %d bytes from the stream, want at most %d", src.read, max+readBufferSize+1)
	}
}

func TestReadFrameOneByteReader(t *testing.T) {
	t.Parallel()
	stream := "\n" + frame("MSH|^~\\&|A") + frame(strings.Repeat("x", 100))
	r := newReaderSize(iotest.OneByteReader(strings.NewReader(stream)), 0, 16)
	for _, want := range []string{"MSH|^~\\&|A", strings.Repeat("x", 100)} {
		got, err := r.ReadFrame()
		if err != nil || string(got) != want {
			t.Fatalf("ReadFrame() = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("final error = %v, want io.EOF", err)
	}
}

func TestReadFrameWrapsTransportErrors(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()

	go func() { _, _ = client.Write([]byte("\x0bMSH|partial")) }()
	if err := server.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := NewReader(server, 0).ReadFrame()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("error = %v, want one wrapping os.ErrDeadlineExceeded", err)
	}
	if strings.Contains(err.Error(), "partial") {
		t.Fatalf("error %q leaks message bytes", err)
	}
}

func TestWriteFrame(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := WriteFrame(&buf, []byte("MSH|a\rPID|b\r")); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), frame("MSH|a\rPID|b\r"); got != want {
		t.Fatalf("WriteFrame wrote %q, want %q", got, want)
	}
}

func TestWriteFrameRejectsEndBlock(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := WriteFrame(&buf, []byte("MSH|\x1c|x")); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("error = %v, want ErrInvalidMessage", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("wrote %d bytes for an invalid message", buf.Len())
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

func TestWriteFrameWrapsWriteError(t *testing.T) {
	t.Parallel()
	err := WriteFrame(errWriter{io.ErrClosedPipe}, []byte("MSH"))
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("error = %v, want one wrapping io.ErrClosedPipe", err)
	}
}
