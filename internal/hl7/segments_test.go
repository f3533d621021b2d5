package hl7

import (
	"strings"
	"testing"
)

func TestSegmentEdits(t *testing.T) {
	m, err := Parse([]byte("MSH|^~\\&|A|B|C|D|20240101||ORU^R01|1|P|2.5.1\rPID|1||123\rOBX|1|NM|GLU||5\rNTE|1||a\rOBX|2|NM|NA||140\rNTE|1||b\r"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.SegmentText(0); got != "MSH|^~\\&|A|B|C|D|20240101||ORU^R01|1|P|2.5.1" {
		t.Errorf("MSH text %q", got)
	}
	if i := m.SegmentIndex("OBX", 2); i != 4 || m.SegmentText(i) != "OBX|2|NM|NA||140" {
		t.Errorf("OBX(2) at %d: %q", i, m.SegmentText(i))
	}
	if _, err := m.RemoveSegments("MSH", 0); err == nil {
		t.Error("the MSH was removed")
	}
	if n, _ := m.RemoveSegments("NTE", 2); n != 1 || strings.Join(m.SegmentIDs(), ",") != "MSH,PID,OBX,NTE,OBX" {
		t.Errorf("remove NTE(2): %d, %v", n, m.SegmentIDs())
	}
	if n, _ := m.RemoveSegments("ZZZ", 0); n != 0 {
		t.Errorf("removed %d absent segments", n)
	}
	// Inserted text is read with the message's delimiters, and escapes
	// stay escapes.
	if err := m.InsertSegment(3, `ZVC|1|A^B|x\F\y`); err != nil {
		t.Fatal(err)
	}
	if m.Get("ZVC-2.2") != "B" || m.Get("ZVC-3") != "x|y" || m.SegmentIndex("ZVC", 1) != 3 {
		t.Errorf("inserted ZVC: %q %q at %d", m.Get("ZVC-2.2"), m.Get("ZVC-3"), m.SegmentIndex("ZVC", 1))
	}
	for _, bad := range []struct {
		at   int
		text string
	}{{0, "ZVC|1"}, {99, "ZVC|1"}, {1, "ZVC|1\rZVD|2"}, {1, "MSH|^~\\&|x"}, {1, "Z"}, {1, "ZVC 1"}} {
		if err := m.InsertSegment(bad.at, bad.text); err == nil {
			t.Errorf("InsertSegment(%d, %q) accepted", bad.at, bad.text)
		}
	}
	if err := (&Message{}).InsertSegment(0, "ZVC|1"); err == nil {
		t.Error("insert into a message without MSH accepted")
	}
}
