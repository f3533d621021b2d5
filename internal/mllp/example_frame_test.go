package mllp_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/mefor/mefor/internal/mllp"
)

// A frame is a start block (0x0B), the message, an end block (0x1C) and a
// carriage return. ReadFrame returns the message without the envelope and
// skips, counting them, bytes that arrive between frames, such as the line
// feed some senders add after each frame.
func ExampleReader_ReadFrame() {
	var wire bytes.Buffer
	for _, msg := range []string{"MSH|^~\\&|A\rPID|1\r", "MSH|^~\\&|B\r"} {
		if err := mllp.WriteFrame(&wire, []byte(msg)); err != nil {
			panic(err)
		}
		wire.WriteByte('\n')
	}
	fmt.Printf("on the wire: %q\n", wire.String())

	r := mllp.NewReader(&wire, mllp.DefaultMaxFrameSize)
	for {
		msg, err := r.ReadFrame()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(err)
		}
		fmt.Printf("frame: %q\n", msg)
	}
	fmt.Println("bytes skipped between frames:", r.Discarded())

	// A message holding the end block byte would end its frame early on the
	// receiving side: WriteFrame refuses it and writes nothing.
	fmt.Println(mllp.WriteFrame(io.Discard, []byte("MSH|\x1c")))
	// Output:
	// on the wire: "\vMSH|^~\\&|A\rPID|1\r\x1c\r\n\vMSH|^~\\&|B\r\x1c\r\n"
	// frame: "MSH|^~\\&|A\rPID|1\r"
	// frame: "MSH|^~\\&|B\r"
	// bytes skipped between frames: 2
	// mllp: message contains the end block byte 0x1C
}

// A frame longer than the reader's limit is cut at the limit and reported
// with ErrFrameTooLarge: the first bytes still hold the header, enough to
// answer with a negative acknowledgment, and the connection is then closed.
func ExampleReader_ReadFrame_tooLarge() {
	var wire bytes.Buffer
	if err := mllp.WriteFrame(&wire, []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|C1|P|2.5\rOBX|1|ED|...")); err != nil {
		panic(err)
	}
	r := mllp.NewReader(&wire, 48)
	msg, err := r.ReadFrame()
	fmt.Println(errors.Is(err, mllp.ErrFrameTooLarge))
	fmt.Printf("%q\n", msg)
	// Output:
	// true
	// "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|C1|P|2.5\rOBX|"
}
