package admission_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/admission"
)

func TestSourcesAllow(t *testing.T) {
	s := mustSources(t, "10.1.0.0/16", "192.168.7.9", "fd00::/64", "::ffff:172.16.0.1")
	for addr, want := range map[string]bool{
		"10.1.2.3":          true,
		"10.2.0.1":          false,
		"192.168.7.9":       true,
		"192.168.7.10":      false,
		"::ffff:10.1.9.9":   true, // IPv4 through an IPv6 socket
		"fd00::5":           true,
		"fd00:0:0:1::5":     false,
		"172.16.0.1":        true,
		"::ffff:172.16.0.1": true,
	} {
		if got := s.Allows(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Allows(%s) = %v, want %v", addr, got, want)
		}
	}
	var none *admission.Sources
	if !none.Allows(netip.MustParseAddr("203.0.113.5")) {
		t.Error("no allow list refused a source")
	}
}

// Each bad entry is refused with what to write instead.
func TestParseSourceErrors(t *testing.T) {
	for in, want := range map[string]string{
		"":                "is empty",
		"lab.example.org": "is a host name",
		"localhost":       "is a host name",
		"10.1.2.3:2575":   "has a port; write the address alone (10.1.2.3)",
		"10.1.2.3/8":      "did you mean 10.0.0.0/8?",
		"10.1.2.300":      "is not an IP address or network",
		"10.0.0.0/33":     "is not a network in CIDR notation",
		"fe80::1%eth0":    "zone",
	} {
		_, err := admission.ParseSource(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSource(%q) = %v, want an error saying %q", in, err, want)
		}
	}
	if _, err := admission.NewSources(nil); err == nil {
		t.Error("an empty allow list was accepted")
	}
}
