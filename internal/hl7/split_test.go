package hl7

import (
	"strings"
	"testing"
)

func TestSplitMessages(t *testing.T) {
	a := "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1||X\r"
	b := "MSH|^~\\&|A|B|C|D|20240101||ADT^A08|2|P|2.5\rPID|1||Y\r"
	cases := map[string]string{
		"wire style, newline between messages": a + "\n" + b + "\n",
		"one segment per line":                 strings.ReplaceAll(a+b, "\r", "\n"),
		"crlf with blank lines":                strings.ReplaceAll(a, "\r", "\r\n") + "\r\n\r\n" + strings.ReplaceAll(b, "\r", "\r\n"),
		"no separator between messages":        a + b,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			got := SplitMessages([]byte(in))
			if len(got) != 2 || string(got[0]) != a || string(got[1]) != b {
				t.Fatalf("got %d messages %q, want [%q %q]", len(got), got, a, b)
			}
		})
	}
	if got := SplitMessages([]byte("junk\r" + a)); len(got) != 2 || string(got[0]) != "junk\r" {
		t.Fatalf("content before MSH should be kept as its own message, got %q", got)
	}
	if got := SplitMessages([]byte("\n\n")); len(got) != 0 {
		t.Fatalf("blank input gave %d messages", len(got))
	}
}
