package hl7

import (
	"errors"
	"strings"
	"testing"
)

func TestParseEncodeIdentical(t *testing.T) {
	t.Parallel()
	for name, raw := range wellFormed {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m, err := Parse([]byte(raw))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := string(m.Encode()); got != raw {
				t.Errorf("Encode differs\n got: %q\nwant: %q", got, raw)
			}
		})
	}
}

func TestParseTolerates(t *testing.T) {
	t.Parallel()
	canonical := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X`, `PV1|1`)
	tests := map[string]string{
		"LF":                       "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\nPID|1||X\nPV1|1\n",
		"CRLF":                     "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\r\nPID|1||X\r\nPV1|1\r\n",
		"mixed":                    "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\r\nPID|1||X\nPV1|1\r",
		"no final terminator":      "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1||X\rPV1|1",
		"trailing empty lines":     canonical + "\r\n\r\n\n\r",
		"trailing whitespace line": canonical + "  \t\r\n",
		"blank line inside":        "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\r\rPID|1||X\r\n\r\nPV1|1\r",
		"BOM":                      "\xef\xbb\xbf" + canonical,
		"leading whitespace":       "\r\n \t" + canonical,
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m, err := Parse([]byte(raw))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := string(m.Encode()); got != canonical {
				t.Errorf("Encode\n got: %q\nwant: %q", got, canonical)
			}
		})
	}
}

func TestParseDelimiters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		raw  string
		want Delimiters
	}{
		{"default", adtA01, DefaultDelimiters()},
		{"non-default", nonDefault, Delimiters{Field: '#', Component: '*', Repetition: '@', Escape: '!', Subcomponent: '%'}},
		{"truncation", v27, Delimiters{Field: '|', Component: '^', Repetition: '~', Escape: '\\', Subcomponent: '&', Truncation: '#'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := Parse([]byte(tt.raw))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := m.Delimiters(); got != tt.want {
				t.Errorf("Delimiters() = %+v, want %+v", got, tt.want)
			}
			if got, want := m.Get("MSH-2"), tt.want.EncodingCharacters(); got != want {
				t.Errorf("MSH-2 = %q, want %q", got, want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	// SECRET stands for PHI: it must never show up in an error.
	tests := []struct {
		name    string
		raw     string
		kind    error
		segment int
		offset  int
	}{
		{"nil", "", ErrEmpty, 0, -1},
		{"whitespace", " \r\n\t\r", ErrEmpty, 0, -1},
		{"BOM only", "\xef\xbb\xbf", ErrEmpty, 0, -1},
		{"no MSH", "PID|1||SECRET\r", ErrNoMSH, 1, 0},
		{"no MSH after whitespace", "\r\nEVN|SECRET", ErrNoMSH, 1, 2},
		{"lowercase msh", "msh|^~\\&|SECRET", ErrNoMSH, 1, 0},
		{"MLLP framing left in", "\x0bMSH|^~\\&|SECRET\r\x1c\r", ErrNoMSH, 1, 0},
		{"just MS", "MS", ErrTruncated, 1, 2},
		{"just MSH", "MSH", ErrTruncated, 1, 3},
		{"MSH and separator", "MSH|", ErrTruncated, 1, 4},
		{"MSH-2 cut short", "MSH|^~", ErrTruncated, 1, 6},
		{"MSH-2 cut short by CR", "MSH|^~\rPID|SECRET", ErrTruncated, 1, 6},
		{"alnum field separator", "MSHA^~\\&ASECRET", ErrBadDelimiters, 1, 3},
		{"space field separator", "MSH ^~\\& SECRET", ErrBadDelimiters, 1, 3},
		{"short MSH-2", "MSH|^~|SECRET", ErrBadDelimiters, 1, 4},
		{"long MSH-2", "MSH|^~\\&#!|SECRET", ErrBadDelimiters, 1, 4},
		{"duplicate encoding chars", "MSH|^^\\&|SECRET", ErrBadDelimiters, 1, 5},
		{"truncation char duplicates", "MSH|^~\\&^|SECRET", ErrBadDelimiters, 1, 8},
		{"alnum encoding char", "MSH|^~\\a|SECRET", ErrBadDelimiters, 1, 7},
		{"value continued on next line", "MSH|^~\\&|A\rOBX|1|TX|||first line\rSECRET text continues\r", ErrBadSegment, 3, 33},
		{"short segment id", "MSH|^~\\&|A\rPI|SECRET\r", ErrBadSegment, 2, 11},
		{"segment id not followed by separator", "MSH|^~\\&|A\rPIDX|SECRET\r", ErrBadSegment, 2, 11},
		{"punctuation in segment id", "MSH|^~\\&|A\rP-D|SECRET\r", ErrBadSegment, 2, 11},
		{"second MSH (batch)", "MSH|^~\\&|A\rPID|1\rMSH|^~\\&|SECRET\r", ErrBadSegment, 3, 17},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := Parse([]byte(tt.raw))
			if err == nil {
				t.Fatalf("Parse succeeded with %d segments, want error", len(m.segments))
			}
			if !errors.Is(err, tt.kind) {
				t.Errorf("error %q is not %v", err, tt.kind)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *ParseError", err)
			}
			if pe.Segment != tt.segment || pe.Offset != tt.offset {
				t.Errorf("at segment %d byte %d, want segment %d byte %d", pe.Segment, pe.Offset, tt.segment, tt.offset)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error leaks content: %q", err)
			}
		})
	}
}

func TestParseDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	raw := []byte(adtA01)
	m, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		raw[i] = 'x'
	}
	if got := m.Get("PID-5.1"); got != "EVERYMAN" {
		t.Errorf("PID-5.1 = %q after overwriting the input", got)
	}
}

func TestParseNoPanicOnPrefixes(t *testing.T) {
	t.Parallel()
	// Every truncation of a real message either parses or fails cleanly.
	for _, raw := range wellFormed {
		for i := range len(raw) {
			m, err := Parse([]byte(raw[:i]))
			if err == nil {
				_ = m.Encode()
			}
		}
	}
}
