package hl7

import (
	"errors"
	"testing"
)

func mustParse(t testing.TB, raw string) *Message {
	t.Helper()
	m, err := Parse([]byte(raw))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}

func mustPath(t testing.TB, s string) Path {
	t.Helper()
	p, err := ParsePath(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLookup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		msg, path string
		want      string
		ok        bool
	}{
		{adtA01, "MSH-1", "|", true},
		{adtA01, "MSH-2", `^~\&`, true},
		{adtA01, "MSH-2.1", `^~\&`, true},
		{adtA01, "MSH-2.2", "", false},
		{adtA01, "MSH-3", "ADT1", true},
		{adtA01, "MSH-9", "ADT^A01^ADT_A01", true},
		{adtA01, "MSH-9.2", "A01", true},
		{adtA01, "MSH-10", "MSG00001", true},
		{adtA01, "MSH-12", "2.5.1", true},
		{adtA01, "MSH-13", "", false},
		{adtA01, "PID-3.1", "PATID1234", true},
		{adtA01, "PID-3[1].1", "PATID1234", true},
		{adtA01, "PID-3[2].1", "123456789", true},
		{adtA01, "PID-3[2].5", "SS", true},
		{adtA01, "PID-3[3].4", "NC&2.16.840.1.113883.4.3.37&ISO", true},
		{adtA01, "PID-3[3].4.2", "2.16.840.1.113883.4.3.37", true},
		{adtA01, "PID-3[3].4.4", "", false},
		{adtA01, "PID-3[4]", "", false},
		{adtA01, "PID-3[2]", "123456789^^^USSSA^SS", true},
		{adtA01, "PID-3.2", "", true}, // present, empty
		{adtA01, "PID-3.9", "", false},
		{adtA01, "PID-2", "", true},
		{adtA01, "PID-5", "EVERYMAN^ADAM^A^III", true},
		{adtA01, "PID-5.2", "ADAM", true},
		{adtA01, "PID-5.1.1", "EVERYMAN", true},
		{adtA01, "PID(1)-5.1", "EVERYMAN", true},
		{adtA01, "PID(2)-5.1", "", false},
		{adtA01, "PV1-15", "A0", true},
		{adtA01, "PV1-16", "", true}, // trailing separator makes an empty field
		{adtA01, "PV1-17", "", false},
		{adtA01, "OBX-5", "", false},
		{oruR01, "OBX(2)-5", "95", true},
		{oruR01, "OBX(3)-3.2", "POTASSIUM", true},
		{oruR01, "OBX(4)-5", "Sample hemolyzed & re-drawn\r\nResult: 5 ^ 6 | ok \\.br\\next", true},
		{oruR01, "OBX(5)-5", "A~B~C", true},
		{oruR01, "OBX(5)-5[3]", "C", true},
		{oruR01, "OBX(6)-5", "", false},
		{oruR01, "ZPD-2.3", "segment", true},
		{nonDefault, "MSH-1", "#", true},
		{nonDefault, "MSH-2", "*@!%", true},
		{nonDefault, "MSH-3.2", "1.2.3", true},
		{nonDefault, "MSH-9.2", "A08", true},
		{nonDefault, "PID-3[2].1", "ID2", true},
		{nonDefault, "PID-4", "#weird*name", true},
		{nonDefault, "PID-5.2.2", "X", true},
		{v27, "MSH-2", `^~\&#`, true},
		{v27, "PID-5", "LONG#NAME", true},
		{adtA01, "not a path", "", false},
	}
	for _, tt := range tests {
		m := mustParse(t, tt.msg)
		got, ok := m.Lookup(tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
		}
		if g := m.Get(tt.path); g != tt.want {
			t.Errorf("Get(%q) = %q, want %q", tt.path, g, tt.want)
		}
	}
}

func TestLookupZeroMessage(t *testing.T) {
	t.Parallel()
	var m Message
	if v, ok := m.Lookup("MSH-9"); v != "" || ok {
		t.Errorf("zero Message Lookup = %q, %v", v, ok)
	}
	if err := m.Set("PID-3", "x"); err == nil {
		t.Error("Set on zero Message succeeded")
	}
	if got := m.Encode(); len(got) != 0 {
		t.Errorf("zero Message Encode = %q", got)
	}
	if v, ok := m.LookupPath(Path{}); v != "" || ok {
		t.Error("zero Path found something")
	}
}

func TestSet(t *testing.T) {
	t.Parallel()
	base := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN`)
	tests := []struct {
		name, path, value string
		want              string
	}{
		{"replace field", "PID-1", "2", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|2||X^^^MR~Y^^^SS||DOE^JOHN`)},
		{"field replaces all structure", "PID-3", "Z", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||Z||DOE^JOHN`)},
		{"component", "PID-5.2", "JANE", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JANE`)},
		{"component of second repetition", "PID-3[2].4", "NPI", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^NPI||DOE^JOHN`)},
		{"new repetition", "PID-3[4].1", "W", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS~~W||DOE^JOHN`)},
		{"whole repetition", "PID-3[1]", "Q", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||Q~Y^^^SS||DOE^JOHN`)},
		{"new component", "PID-5.5", "JR", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN^^^JR`)},
		{"new subcomponent", "PID-3.4.3", "ISO", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR&&ISO~Y^^^SS||DOE^JOHN`)},
		{"new field", "PID-8", "F", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|||F`)},
		{"escapes delimiters", "PID-5.1", `O|B^R~I&E\N`, seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||O\F\B\S\R\R\I\T\E\E\N^JOHN`)},
		{"escapes line breaks", "PID-5.1", "A\r\nB", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||A\X0D\\X0A\B^JOHN`)},
		{"new segment", "ZPI-2.1", "z", base + "ZPI||z\r"},
		{"new segments up to occurrence", "PID(3)-1", "3", base + "PID\rPID|3\r"},
		{"MSH field", "MSH-10", "NEW", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|NEW|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN`)},
		{"MSH trigger", "MSH-9.2", "A08", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A08|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN`)},
		{"MSH new field", "MSH-15", "AL", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5|||AL`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN`)},
		{"empty", "PID-5.2", "", seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := mustParse(t, base)
			if err := m.Set(tt.path, tt.value); err != nil {
				t.Fatalf("Set: %v", err)
			}
			if got := string(m.Encode()); got != tt.want {
				t.Errorf("Encode\n got: %q\nwant: %q", got, tt.want)
			}
			if got := m.Get(tt.path); got != tt.value {
				t.Errorf("Get after Set = %q, want %q", got, tt.value)
			}
			// The edit survives a round trip through the wire format.
			if got := mustParse(t, string(m.Encode())).Get(tt.path); got != tt.value {
				t.Errorf("Get after re-parse = %q, want %q", got, tt.value)
			}
		})
	}
}

func TestSetNonDefaultDelimiters(t *testing.T) {
	t.Parallel()
	m := mustParse(t, nonDefault)
	if err := m.Set("PID-5.1", "A#B*C!D|E"); err != nil {
		t.Fatal(err)
	}
	want := seg(
		`MSH#*@!%#SENDER*1.2.3*ISO#FAC#RECV#RFAC#20240102030405##ADT*A08*ADT_A01#CTRL-77#T#2.3`,
		`PID#1##ID1*1*2*AUTH@ID2*3#!F!weird!S!name#A!F!B!S!C!E!D|E*JANE%X`,
	)
	if got := string(m.Encode()); got != want {
		t.Errorf("Encode\n got: %q\nwant: %q", got, want)
	}
}

func TestSetTruncationChar(t *testing.T) {
	t.Parallel()
	m := mustParse(t, v27)
	if err := m.Set("PID-5", "A#B"); err != nil {
		t.Fatal(err)
	}
	if got := m.segments[1][5]; got != `A\P\B` {
		t.Errorf("PID-5 encoded as %q", got)
	}
}

func TestSetErrors(t *testing.T) {
	t.Parallel()
	m := mustParse(t, adtA01)
	before := string(m.Encode())
	for _, path := range []string{"MSH-1", "MSH-2", "MSH-2.1"} {
		if err := m.Set(path, "x"); !errors.Is(err, ErrReadOnly) {
			t.Errorf("Set(%q) = %v, want ErrReadOnly", path, err)
		}
		if err := m.Clear(path); !errors.Is(err, ErrReadOnly) {
			t.Errorf("Clear(%q) = %v, want ErrReadOnly", path, err)
		}
	}
	if err := m.Set("MSH(2)-3", "x"); err == nil {
		t.Error("Set created a second MSH")
	}
	var pe *PathError
	if err := m.Set("PID-x", "x"); !errors.As(err, &pe) {
		t.Errorf("Set with bad path = %v, want *PathError", err)
	}
	if err := m.SetPath(Path{}, "x"); err == nil {
		t.Error("SetPath with zero Path succeeded")
	}
	if got := string(m.Encode()); got != before {
		t.Error("failed edits changed the message")
	}
}

func TestClear(t *testing.T) {
	t.Parallel()
	base := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|19700101`)
	tests := []struct{ path, want string }{
		{"PID-3", `PID|1||||DOE^JOHN|19700101`},
		{"PID-3[2]", `PID|1||X^^^MR~||DOE^JOHN|19700101`},
		{"PID-5.1", `PID|1||X^^^MR~Y^^^SS||^JOHN|19700101`},
		{"PID-6", `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|`},
		{"PID-7", `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|19700101`},      // absent: no change
		{"PID-5.7", `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|19700101`},    // absent: no change
		{"PID-3[5].1", `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|19700101`}, // absent: no change
		{"ZZZ-1", `PID|1||X^^^MR~Y^^^SS||DOE^JOHN|19700101`},      // absent: not created
	}
	for _, tt := range tests {
		m := mustParse(t, base)
		if err := m.Clear(tt.path); err != nil {
			t.Fatalf("Clear(%q): %v", tt.path, err)
		}
		want := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, tt.want)
		if got := string(m.Encode()); got != want {
			t.Errorf("Clear(%q)\n got: %q\nwant: %q", tt.path, got, want)
		}
	}
}

func TestCopy(t *testing.T) {
	t.Parallel()
	base := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR&1.2&ISO~Y^^^SS||DOE\T\SMITH^JOHN`, `NK1|1|OLD`)
	tests := []struct{ from, to, want string }{
		{"PID-5", "NK1-2", `NK1|1|DOE\T\SMITH^JOHN`},
		{"PID-3", "NK1-2", `NK1|1|X^^^MR&1.2&ISO~Y^^^SS`},
		{"PID-3[2]", "NK1-2", `NK1|1|Y^^^SS`},
		{"PID-3", "NK1-2[2]", `NK1|1|OLD~X^^^MR&1.2&ISO\R\Y^^^SS`},
		{"PID-5", "NK1-2.2", `NK1|1|OLD^DOE\T\SMITH\S\JOHN`},
		{"PID-3.4", "NK1-2.1", `NK1|1|MR&1.2&ISO`},
		{"PID-3.4", "NK1-2.1.1", `NK1|1|MR\T\1.2\T\ISO`},
		{"PID-3.4.2", "NK1-3", `NK1|1|OLD|1.2`},
		{"PID-9", "NK1-2", `NK1|1|`},    // absent source clears the target
		{"PID-9", "NK1-9", `NK1|1|OLD`}, // ... and does not create it
		{"MSH-2", "NK1-2", `NK1|1|\S\\R\\E\\T\`},
		{"MSH-1", "NK1-2", `NK1|1|\F\`},
	}
	for _, tt := range tests {
		m := mustParse(t, base)
		if err := m.Copy(mustPath(t, tt.from), mustPath(t, tt.to)); err != nil {
			t.Fatalf("Copy(%s, %s): %v", tt.from, tt.to, err)
		}
		want := seg(`MSH|^~\&|A|B|C|D|20240101||ADT^A01|1|P|2.5`, `PID|1||X^^^MR&1.2&ISO~Y^^^SS||DOE\T\SMITH^JOHN`, tt.want)
		if got := string(m.Encode()); got != want {
			t.Errorf("Copy(%s, %s)\n got: %q\nwant: %q", tt.from, tt.to, got, want)
		}
		if _, err := Parse(m.Encode()); err != nil {
			t.Errorf("Copy(%s, %s) produced an unparsable message: %v", tt.from, tt.to, err)
		}
	}
	m := mustParse(t, base)
	if err := m.Copy(mustPath(t, "PID-3"), mustPath(t, "MSH-2")); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Copy to MSH-2 = %v, want ErrReadOnly", err)
	}
}

func TestClone(t *testing.T) {
	t.Parallel()
	m := mustParse(t, adtA01)
	c := m.Clone()
	if err := c.Set("PID-5.1", "CHANGED"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("ZZZ-1", "new"); err != nil {
		t.Fatal(err)
	}
	if got := string(m.Encode()); got != adtA01 {
		t.Error("editing the clone changed the original")
	}
	if got := c.Get("PID-5.1"); got != "CHANGED" {
		t.Errorf("clone PID-5.1 = %q", got)
	}
}

func TestCountAndSegmentIDs(t *testing.T) {
	t.Parallel()
	m := mustParse(t, oruR01)
	if got := m.Count("OBX"); got != 5 {
		t.Errorf("Count(OBX) = %d", got)
	}
	if got := m.Count("PV1"); got != 0 {
		t.Errorf("Count(PV1) = %d", got)
	}
	want := []string{"MSH", "PID", "OBR", "OBX", "OBX", "OBX", "OBX", "OBX", "NTE", "ZPD"}
	got := m.SegmentIDs()
	if len(got) != len(want) {
		t.Fatalf("SegmentIDs = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("SegmentIDs = %v, want %v", got, want)
		}
	}
}
