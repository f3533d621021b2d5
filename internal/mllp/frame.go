package mllp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// The MLLP envelope: a start block, the message, then an end block followed
// by a carriage return.
const (
	startBlock     = 0x0B
	endBlock       = 0x1C
	carriageReturn = 0x0D
)

// DefaultMaxFrameSize is the frame size limit used when none is configured.
// It is generous for HL7 v2, whose messages are usually a few kilobytes, while
// still bounding the memory one connection can make the process hold.
const DefaultMaxFrameSize = 1 << 20

// readBufferSize is large enough to hold a typical HL7 message whole, so the
// common case reads a frame with a single buffered scan.
const readBufferSize = 8 << 10

var (
	// ErrFrameTooLarge is returned when a frame's message is longer than the
	// maximum frame size.
	ErrFrameTooLarge = errors.New("mllp: frame exceeds maximum size")

	// ErrMalformedFrame is returned when an end block is not followed by a
	// carriage return. The stream cannot be resynchronised reliably after
	// that, so the connection should be closed.
	ErrMalformedFrame = errors.New("mllp: end block not followed by carriage return")

	// ErrInvalidMessage is returned by WriteFrame (and Client.Send) for a
	// message containing the end block byte 0x1C, which would end the frame
	// early on the receiving side.
	ErrInvalidMessage = errors.New("mllp: message contains the end block byte 0x1C")
)

// Reader reads MLLP frames from a byte stream.
//
// Bytes that arrive between frames, before a start block, are discarded and
// counted (see Discarded) rather than reported as errors: some senders
// follow each frame with a line feed, and rejecting the connection for that
// would gain nothing. Inside a frame the reader is strict: the message runs
// until the first end block, which must be followed by a carriage return.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	br        *bufio.Reader
	max       int
	discarded int64
}

// NewReader returns a Reader that reads frames from r and rejects messages
// longer than maxFrameSize bytes. A maxFrameSize of zero or less means
// DefaultMaxFrameSize.
func NewReader(r io.Reader, maxFrameSize int) *Reader {
	return newReaderSize(r, maxFrameSize, readBufferSize)
}

func newReaderSize(r io.Reader, maxFrameSize, bufSize int) *Reader {
	if maxFrameSize <= 0 {
		maxFrameSize = DefaultMaxFrameSize
	}
	return &Reader{br: bufio.NewReaderSize(r, bufSize), max: maxFrameSize}
}

// MaxFrameSize reports the largest message, in bytes, that ReadFrame accepts.
func (r *Reader) MaxFrameSize() int { return r.max }

// Discarded reports how many bytes found outside frames have been skipped so
// far.
func (r *Reader) Discarded() int64 { return r.discarded }

// ReadFrame reads the next frame and returns its message without the
// envelope. The returned slice is newly allocated and owned by the caller; it
// is empty but non-nil for an empty frame.
//
// ReadFrame returns io.EOF if the stream ends cleanly between frames (after
// skipping any bytes outside frames), and io.ErrUnexpectedEOF if it ends
// inside a frame.
//
// If the message is longer than the maximum frame size, ReadFrame stops
// reading there and returns the first MaxFrameSize bytes of the message along
// with ErrFrameTooLarge, so the caller can build a negative acknowledgement
// from its header. The rest of the frame is left unread: the stream is no
// longer in step with the sender's frames and should be abandoned.
//
// Errors other than io.EOF and io.ErrUnexpectedEOF are wrapped; use errors.Is
// to test for them.
func (r *Reader) ReadFrame() ([]byte, error) {
	if err := r.skipToStart(); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("mllp: waiting for frame: %w", err)
	}
	if _, err := r.br.Discard(1); err != nil { // the start block, already buffered
		return nil, fmt.Errorf("mllp: reading frame: %w", err)
	}

	var msg []byte
	for {
		chunk, err := r.br.ReadSlice(endBlock)
		content := chunk
		if err == nil {
			content = chunk[:len(chunk)-1] // drop the end block
		}
		if len(msg)+len(content) > r.max {
			// Keep exactly the allowed prefix; nothing beyond the limit is
			// held, and at most one buffer's worth beyond it has been read.
			msg = append(msg, content[:r.max-len(msg)]...)
			return msg, ErrFrameTooLarge
		}
		msg = append(msg, content...)

		switch {
		case err == nil:
			return r.finishFrame(msg)
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, fmt.Errorf("mllp: reading frame: %w", err)
		}
	}
}

// finishFrame consumes the carriage return that must follow the end block.
func (r *Reader) finishFrame(msg []byte) ([]byte, error) {
	b, err := r.br.ReadByte()
	switch {
	case err == io.EOF:
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, fmt.Errorf("mllp: reading frame: %w", err)
	case b != carriageReturn:
		return nil, ErrMalformedFrame
	}
	if msg == nil {
		msg = []byte{}
	}
	return msg, nil
}

// skipToStart discards bytes until the next unread byte is a start block,
// which it leaves unread. The server uses it to wait for a frame to begin
// without counting stray bytes between frames as the start of one. Errors
// are returned unwrapped.
func (r *Reader) skipToStart() error {
	for {
		if _, err := r.br.Peek(1); err != nil {
			return err
		}
		buf, _ := r.br.Peek(r.br.Buffered()) // cannot fail: already buffered
		i := bytes.IndexByte(buf, startBlock)
		if i < 0 {
			i = len(buf)
		}
		n, _ := r.br.Discard(i) // cannot fail: already buffered
		r.discarded += int64(n)
		if i < len(buf) {
			return nil
		}
	}
}

// buffered reports how many bytes have been read from the stream but not yet
// consumed.
func (r *Reader) buffered() int { return r.br.Buffered() }

// WriteFrame writes msg to w wrapped in an MLLP envelope, with a single call
// to w.Write so that a frame goes out in as few packets as possible. It
// returns ErrInvalidMessage, writing nothing, if msg contains the end block
// byte.
func WriteFrame(w io.Writer, msg []byte) error {
	if bytes.IndexByte(msg, endBlock) >= 0 {
		return ErrInvalidMessage
	}
	frame := make([]byte, 0, len(msg)+3)
	frame = append(frame, startBlock)
	frame = append(frame, msg...)
	frame = append(frame, endBlock, carriageReturn)
	if _, err := w.Write(frame); err != nil {
		return fmt.Errorf("mllp: writing frame: %w", err)
	}
	return nil
}
