package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseHL7Path(t *testing.T) {
	valid := []string{
		"PID-3", "PID-3.1", "PID-3.1.2", "MSH-9.2", "OBX(2)-5", "PID-3[2].1",
		"OBX(10)-5[3].2.1", "ZPD-1", "PV1-19", "PID-9999",
	}
	for _, s := range valid {
		if err := checkHL7Path(s); err != nil {
			t.Errorf("checkHL7Path(%q) = %v, want nil", s, err)
		}
	}

	invalid := []struct{ path, msg string }{
		{"", "is empty"},
		{"PI", "must start with a three-character segment ID"},
		{"1ID-3", "must start with a three-character segment ID"},
		{"pid-3", "segment IDs are upper case: PID-3"},
		{"PID", "names a segment but no field; add one, e.g. PID-3"},
		{"PID.3.1", "separate segment and field with '-', not '.': PID-3.1"},
		{"PID3", "expected '-' and a field number after PID"},
		{"PID-", "expected a field number"},
		{"PID-0", "expected a field number from 1 to 9999"},
		{"PID-10000", "expected a field number from 1 to 9999"},
		{"PID-3-1", "use '.' between field and component, e.g. PID-3.1"},
		{"OBX()-5", "segment occurrence must be a number from 1"},
		{"OBX(0)-5", "segment occurrence must be a number from 1"},
		{"OBX(2-5", "segment occurrence must be a number from 1"},
		{"PID-3[]", "field repetition must be a number from 1"},
		{"PID-3[2", "field repetition must be a number from 1"},
		{"PID-3.0", "component must be a number from 1"},
		{"PID-3.1.", "subcomponent must be a number from 1"},
		{"PID-3.1.2.4", "no deeper than a subcomponent"},
		{"PID-3 ", `unexpected " "`},
	}
	for _, tt := range invalid {
		err := checkHL7Path(tt.path)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("checkHL7Path(%q) = %v, want an error containing %q", tt.path, err, tt.msg)
		}
	}
}

func TestHL7LocationReadOnly(t *testing.T) {
	for path, readOnly := range map[string]bool{
		"MSH-1": true, "MSH-2": true, "MSH-2.1": true, "MSH(1)-1": true, "MSH(2)-5": true,
		"MSH-3": false, "MSH-10": false, "MSH-12.1": false, "PID-1": false,
	} {
		loc, err := parseHL7Path(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := loc.readOnly() != ""; got != readOnly {
			t.Errorf("%s: read-only %v, want %v", path, got, readOnly)
		}
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"HOST": "lab", "EMPTY": "", "PORT": "2576"}
	getenv := func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
	tests := []struct{ in, want, err string }{
		{in: "plain", want: "plain"},
		{in: "$HOST and $", want: "$HOST and $"}, // only ${...} is a reference
		{in: "${HOST}:${PORT}", want: "lab:2576"},
		{in: "${MISSING:-fallback}", want: "fallback"},
		{in: "${EMPTY:-fallback}", want: "fallback"},
		{in: "${EMPTY}", want: ""},
		{in: "${HOST:-x}", want: "lab"},
		{in: "${MISSING:-}", want: ""},
		{in: "${MISSING:-a:b-c}", want: "a:b-c"},
		{in: "$${HOST}", want: "${HOST}"},
		{in: "$$${HOST}", want: "$${HOST}"},
		{in: "${HOST}$${HOST}", want: "lab${HOST}"},
		{in: "${MISSING}", err: "uses ${MISSING}, but MISSING is not set"},
		{in: "${HOST", err: `has an unterminated "${HOST"`},
		{in: "${}", err: "${}, which is not a variable reference"},
		{in: "${1X}", err: "${1X}, which is not a variable reference"},
		{in: "${A-B}", err: "${A-B}, which is not a variable reference"},
	}
	for _, tt := range tests {
		got, err := expand(tt.in, getenv)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("expand(%q) = %q, %v; want an error containing %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  string
	}{
		{in: "1048576", want: 1 << 20},
		{in: "512KiB", want: 512 << 10},
		{in: "1MiB", want: 1 << 20},
		{in: "1 MiB", want: 1 << 20},
		{in: "2GiB", want: 2 << 30},
		{in: "100B", want: 100},
		{in: "1MB", err: "did you mean 1MiB?"},
		{in: "64k", err: "did you mean 64KiB?"},
		{in: "1mib", err: "did you mean 1MiB?"},
		{in: "1.5MiB", err: "is not a size"},
		{in: "MiB", err: "is not a size"},
		{in: "-1", err: "is not a size"},
		{in: "lots", err: "is not a size"},
		{in: "99999999999GiB", err: "too large"},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("parseSize(%q) = %d, %v; want an error containing %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	if d, err := parseDuration("1m30s"); err != nil || d != 90*time.Second {
		t.Errorf("parseDuration(1m30s) = %v, %v", d, err)
	}
	for in, msg := range map[string]string{
		"30":   `"30" needs a unit: write 30s`,
		"1.5":  `"1.5" needs a unit`,
		"1 s":  "is not a duration",
		"1sec": "is not a duration",
	} {
		if _, err := parseDuration(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("parseDuration(%q) = %v, want an error containing %q", in, err, msg)
		}
	}
}

func TestSuggest(t *testing.T) {
	options := []string{"heartbeat", "fence_timeout", "lease_ttl", "node_timeout"}
	for in, want := range map[string]string{
		"heartbaet":     "heartbeat",
		"HeartBeat":     "heartbeat",
		"fence-timeout": "fence_timeout",
		"lease":         "", // too far from lease_ttl to be a typo
		"colour":        "",
	} {
		if got := suggest(in, options); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBadNameSuggestsFix(t *testing.T) {
	for name, fix := range map[string]string{
		"ADT In":    `e.g. "adt-in"`,
		"Lab":       `e.g. "lab"`,
		"_private":  `e.g. "private"`,
		"lab/queue": `e.g. "lab-queue"`,
	} {
		if msg := badName(name); !strings.Contains(msg, fix) {
			t.Errorf("badName(%q) = %q, want it to contain %q", name, msg, fix)
		}
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Minute:         "5m",
		time.Hour:               "1h",
		90 * time.Minute:        "1h30m",
		1200 * time.Millisecond: "1.2s",
		30 * time.Second:        "30s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
