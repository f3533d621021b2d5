package egress_test

import (
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/egress"
)

func parseList(t *testing.T, entries ...string) egress.List {
	t.Helper()
	var l egress.List
	for _, s := range entries {
		e, err := egress.ParseEntry(s)
		if err != nil {
			t.Fatalf("ParseEntry(%q): %v", s, err)
		}
		l = append(l, e)
	}
	return l
}

func TestParseEntryRefusesWhatItCannotRead(t *testing.T) {
	for s, want := range map[string]string{
		"":                  "is empty",
		" lab.example.org":  "surrounding spaces",
		"*":                 "every host",
		"*:443":             "every host",
		"10.0.0.1/8":        "write 10.0.0.0/8",
		"10.0.0.0/8:2575":   "not a CIDR",
		"lab.example.org:0": "ports are numbers",
		"lab.example.org:x": "ports are numbers",
		"lab example.org":   "not a host name",
		"fd00::1:2575:x":    "not host:port",
		"https://lab":       "is a URL",
		"lab..example.org":  "not a host name",
		"fe80::1%eth0":      "zone",
	} {
		_, err := egress.ParseEntry(s)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseEntry(%q) = %v, want an error saying %q", s, err, want)
		}
	}
}

func TestListAllows(t *testing.T) {
	l := parseList(t, "lab.example.org:2575", "hie.example.org", "*.terminology.example.net:443",
		"10.20.0.0/16", "192.0.2.7:2576", "fd00::5", "[fd00::6]:443")
	for _, c := range []struct {
		host string
		port int
		want bool
	}{
		{"lab.example.org", 2575, true},
		{"LAB.example.org.", 2575, true},
		{"lab.example.org", 2576, false}, // the entry names its port
		{"hie.example.org", 8443, true},  // no port: any
		{"x.hie.example.org", 443, false},
		{"codes.terminology.example.net", 443, true},
		{"a.b.terminology.example.net", 443, true},
		{"terminology.example.net", 443, false}, // *.domain is below the domain
		{"codes.terminology.example.net", 80, false},
		{"evil-terminology.example.net", 443, false},
		{"10.20.3.4", 2575, true},
		{"10.21.0.1", 2575, false},
		{"192.0.2.7", 2576, true},
		{"192.0.2.7", 2575, false},
		{"fd00::5", 1, true},
		{"fd00::6", 443, true},
		{"fd00::6", 80, false},
		{"::ffff:10.20.0.9", 1, true}, // an IPv4-mapped address is its IPv4 address
		// A CIDR allows addresses, not names that might resolve into it.
		{"in-the-cidr.example.org", 2575, false},
	} {
		if got := l.Allows(c.host, c.port); got != c.want {
			t.Errorf("Allows(%s, %d) = %v, want %v", c.host, c.port, got, c.want)
		}
	}
	var empty egress.List
	if empty.Allows("127.0.0.1", 1) {
		t.Error("an empty list allows something")
	}
}
