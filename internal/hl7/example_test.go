package hl7_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/hl7"
)

// An admission as a sender puts it on the wire: segments end with CR.
const admit = "MSH|^~\\&|ADT1|GOOD HEALTH|LAB|MAIN|20240101120000||ADT^A01^ADT_A01|MSG00001|P|2.5\r" +
	"PID|1||12345^^^MRN~67890^^^INS||DOE^JOHN^Q||19800101|M\r" +
	"PV1|1|I|W^389^1\r"

// Parse reads one message and reports what is wrong without quoting it:
// the error names a kind (errors.Is) and a position, never content.
func ExampleParse() {
	msg, err := hl7.Parse([]byte(admit))
	if err != nil {
		panic(err)
	}
	h := msg.Header()
	fmt.Println(h.MessageType, h.TriggerEvent, h.ControlID, h.Version)
	fmt.Println(msg.SegmentIDs())

	_, err = hl7.Parse([]byte("PID|1||12345\r"))
	fmt.Println(errors.Is(err, hl7.ErrNoMSH), err)
	// Output:
	// ADT A01 MSG00001 2.5
	// [MSH PID PV1]
	// true hl7: message does not start with an MSH segment (segment 1, byte 0)
}

// Fields are read by the paths HL7 documentation uses; values come back
// decoded. Lookup tells an empty element from a missing one.
func ExampleMessage_Get() {
	msg, err := hl7.Parse([]byte(admit))
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Get("PID-5.1"), msg.Get("PID-5.2"))
	fmt.Println(msg.Get("PID-3[2].1"), msg.Get("PID-3[2].4"))
	fmt.Println(msg.Get("MSH-9.3"))

	_, ok := msg.Lookup("PID-2")
	fmt.Println("PID-2 exists:", ok)
	_, ok = msg.Lookup("PID-30")
	fmt.Println("PID-30 exists:", ok)
	// Output:
	// DOE JOHN
	// 67890 INS
	// ADT_A01
	// PID-2 exists: true
	// PID-30 exists: false
}

// Set escapes the value in the message's own delimiters, so the element
// holds exactly that value; Get decodes it again.
func ExampleMessage_Set() {
	msg, err := hl7.Parse([]byte(admit))
	if err != nil {
		panic(err)
	}
	if err := msg.Set("PV1-3.2", "389&B"); err != nil {
		panic(err)
	}
	if err := msg.Set("ZPI-2", "extra"); err != nil { // missing segments are appended
		panic(err)
	}
	fmt.Println(msg.Get("PV1-3.2"))
	fmt.Print(strings.ReplaceAll(string(msg.Encode()), "\r", "\n"))
	fmt.Println(errors.Is(msg.Set("MSH-2", "^~\\#"), hl7.ErrReadOnly))
	// Output:
	// 389&B
	// MSH|^~\&|ADT1|GOOD HEALTH|LAB|MAIN|20240101120000||ADT^A01^ADT_A01|MSG00001|P|2.5
	// PID|1||12345^^^MRN~67890^^^INS||DOE^JOHN^Q||19800101|M
	// PV1|1|I|W^389\T\B^1
	// ZPI||extra
	// true
}

// The receiver's acknowledgment: sender and receiver swapped, the original
// control id in MSA-2, and for an error or reject code an ERR segment
// carrying the text (which must not quote the message).
func ExampleNewACK() {
	msg, err := hl7.Parse([]byte(admit))
	if err != nil {
		panic(err)
	}
	now := time.Date(2024, 1, 1, 12, 0, 5, 0, time.UTC)
	ack := hl7.NewACK(msg, hl7.AckAccept, "", "ACK00001", now)
	fmt.Print(strings.ReplaceAll(string(ack), "\r", "\n"))

	nak := hl7.NewACK(msg, hl7.AckError, "could not store the message", "ACK00002", now)
	fmt.Print(strings.ReplaceAll(string(nak), "\r", "\n"))
	// Output:
	// MSH|^~\&|LAB|MAIN|ADT1|GOOD HEALTH|20240101120005||ACK^A01^ACK|ACK00001|P|2.5
	// MSA|AA|MSG00001
	// MSH|^~\&|LAB|MAIN|ADT1|GOOD HEALTH|20240101120005||ACK^A01^ACK|ACK00002|P|2.5
	// MSA|AE|MSG00001|could not store the message
	// ERR|||207^Application internal error^HL70357|E||||could not store the message
}

// A sender reads the acknowledgment it got back and decides: accepted,
// send again later (error), or give up (reject).
func ExampleParseACK() {
	raw := "MSH|^~\\&|LAB|MAIN|ADT1|GOOD HEALTH|20240101120005||ACK^A01^ACK|ACK00002|P|2.5\r" +
		"MSA|AE|MSG00001\r" +
		"ERR|||207^Application internal error^HL70357|E||||could not store the message\r"
	ack, err := hl7.ParseACK([]byte(raw))
	if err != nil {
		panic(err)
	}
	switch {
	case ack.Code.IsAccept():
		fmt.Println("delivered", ack.ControlID)
	case ack.Code.IsError():
		fmt.Printf("%s: retry %s later (%s)\n", ack.Code, ack.ControlID, ack.Text)
	case ack.Code.IsReject():
		fmt.Println("rejected", ack.ControlID)
	}

	_, err = hl7.ParseACK([]byte("MSH|^~\\&|LAB|MAIN|||20240101||ACK|X|P|2.5\r"))
	fmt.Println(errors.Is(err, hl7.ErrNoMSA))
	// Output:
	// AE: retry MSG00001 later (could not store the message)
	// true
}
