package hl7

import "testing"

func TestParsePath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Path
	}{
		{"PID-3", Path{segment: "PID", field: 3}},
		{"MSH-10", Path{segment: "MSH", field: 10}},
		{"MSH-9.2", Path{segment: "MSH", field: 9, component: 2}},
		{"PID-3.1", Path{segment: "PID", field: 3, component: 1}},
		{"PID-3[2]", Path{segment: "PID", field: 3, repetition: 2}},
		{"PID-3[2].1", Path{segment: "PID", field: 3, repetition: 2, component: 1}},
		{"PID-3.1.2", Path{segment: "PID", field: 3, component: 1, sub: 2}},
		{"OBX(2)-5", Path{segment: "OBX", occurrence: 2, field: 5}},
		{"OBX(1)-5[3].2.1", Path{segment: "OBX", occurrence: 1, field: 5, repetition: 3, component: 2, sub: 1}},
		{"ZP1-9999", Path{segment: "ZP1", field: 9999}},
	}
	for _, tt := range tests {
		got, err := ParsePath(tt.in)
		if err != nil {
			t.Errorf("ParsePath(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParsePath(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if s := got.String(); s != tt.in {
			t.Errorf("ParsePath(%q).String() = %q", tt.in, s)
		}
	}
}

func TestParsePathErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", `hl7 path "": empty path`},
		{"PID", `hl7 path "PID": expected '-' and a field number after the segment`},
		{"pid-3", `hl7 path "pid-3": segment id must be 3 uppercase letters or digits, starting with a letter`},
		{"1ID-3", `hl7 path "1ID-3": segment id must be 3 uppercase letters or digits, starting with a letter`},
		{"PI-3", `hl7 path "PI-3": segment id must be 3 uppercase letters or digits, starting with a letter`},
		{"PID-x", `hl7 path "PID-x": field must be a number`},
		{"PID-", `hl7 path "PID-": field must be a number`},
		{"PID-0", `hl7 path "PID-0": field must be at least 1`},
		{"PID-10000", `hl7 path "PID-10000": field must be at most 9999`},
		{"PID-99999999999999999999", `hl7 path "PID-99999999999999999999": field must be at most 9999`},
		{"PID.3", `hl7 path "PID.3": expected '-' and a field number after the segment`},
		{"PID(0)-3", `hl7 path "PID(0)-3": segment occurrence must be at least 1`},
		{"PID()-3", `hl7 path "PID()-3": segment occurrence must be a number`},
		{"PID(2-3", `hl7 path "PID(2-3": segment occurrence is missing its closing ')'`},
		{"PID-3[", `hl7 path "PID-3[": repetition must be a number`},
		{"PID-3[2", `hl7 path "PID-3[2": repetition is missing its closing ']'`},
		{"PID-3.", `hl7 path "PID-3.": component must be a number`},
		{"PID-3.1.", `hl7 path "PID-3.1.": subcomponent must be a number`},
		{"PID-3.1.2.3", `hl7 path "PID-3.1.2.3": too many levels: a path ends at field.component.subcomponent`},
		{"PID-3 ", `hl7 path "PID-3 ": unexpected text after the path at offset 5`},
		{"PID-3.1[2]", `hl7 path "PID-3.1[2]": unexpected text after the path at offset 7`},
		{"PID--3", `hl7 path "PID--3": field must be a number`},
		{"PID-+3", `hl7 path "PID-+3": field must be a number`},
	}
	for _, tt := range tests {
		_, err := ParsePath(tt.in)
		if err == nil {
			t.Errorf("ParsePath(%q) succeeded", tt.in)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParsePath(%q) error\n got: %s\nwant: %s", tt.in, err, tt.want)
		}
	}
}

func TestPathReadOnly(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"MSH-1": true, "MSH-2": true, "MSH-2.1": true, "MSH(2)-5": true,
		"MSH-3": false, "MSH(1)-3": false, "PID-1": false, "PID-2": false,
	} {
		p, err := ParsePath(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.ReadOnly(); got != want {
			t.Errorf("%s.ReadOnly() = %v, want %v", in, got, want)
		}
	}
	if !(Path{}).IsZero() || (Path{}).String() != "" {
		t.Error("zero Path is not zero")
	}
}
