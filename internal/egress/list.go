package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Entry is one item of an allow-list: a host name, a wildcard domain, an
// address or a CIDR, each but a CIDR optionally with a port.
type Entry struct {
	text string
	// name is a host name, lower case without a trailing dot; for a
	// wildcard, the domain below which every name matches. Empty for an
	// address or a CIDR.
	name string
	wild bool
	// prefix is an address (a full-length prefix) or a CIDR.
	prefix netip.Prefix
	// port is 0 for any port.
	port int
}

// String returns the entry as written.
func (e Entry) String() string { return e.text }

// IsPrefix reports whether the entry is an address or a CIDR.
func (e Entry) IsPrefix() bool { return e.name == "" }

// Prefix returns the address or CIDR of an entry that is one.
func (e Entry) Prefix() netip.Prefix { return e.prefix }

// ParseEntry reads one entry: host:port, host, *.domain, *.domain:port,
// an address (10.1.2.3, 10.1.2.3:2575, ::1, [::1]:2575) or a CIDR
// (10.20.0.0/16). The error says what is wrong and how to write it.
func ParseEntry(s string) (Entry, error) {
	e := Entry{text: s}
	switch {
	case s == "":
		return e, errors.New("is empty; write host:port, host, a CIDR such as 10.20.0.0/16, or \"*.example.org\"")
	case strings.TrimSpace(s) != s:
		return e, errors.New("has surrounding spaces; remove them")
	case s == "*" || strings.HasPrefix(s, "*:"):
		return e, errors.New("would allow every host; list the hosts mefor may reach, or remove the egress: section to connect anywhere")
	case strings.Contains(s, "://"):
		return e, errors.New("is a URL; list its host or host:port, e.g. terminology.example.org:443")
	case strings.Contains(s, "/"):
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return e, fmt.Errorf("is not a CIDR (e.g. 10.20.0.0/16 or fd00::/8); a CIDR takes no port")
		}
		if p.Addr().Zone() != "" {
			return e, errors.New("has an IPv6 zone; list the address without %zone")
		}
		if m := p.Masked(); m != p {
			return e, fmt.Errorf("has bits set past its /%d; write %s", p.Bits(), m)
		}
		e.prefix = p
		return e, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		// A bare IPv6 address: its colons are not a port.
		return entryOfAddr(e, a, 0)
	}
	host, port := s, 0
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return e, fmt.Errorf("has port %q; ports are numbers from 1 to 65535", p)
		}
		host, port = h, n
	} else if strings.Contains(s, ":") {
		return e, errors.New("is not host:port; write IPv6 addresses with a port in brackets, e.g. [fd00::5]:2575")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return entryOfAddr(e, a, port)
	}
	e.port = port
	if d, ok := strings.CutPrefix(host, "*."); ok {
		e.wild, host = true, d
	}
	name, err := hostName(host)
	if err != nil {
		return e, err
	}
	e.name = name
	return e, nil
}

func entryOfAddr(e Entry, a netip.Addr, port int) (Entry, error) {
	if a.Zone() != "" {
		return e, errors.New("has an IPv6 zone; list the address without %zone")
	}
	a = a.Unmap()
	e.prefix, e.port = netip.PrefixFrom(a, a.BitLen()), port
	return e, nil
}

// hostName checks and normalizes a DNS name: letters, digits, '-' and '_'
// in dot-separated labels, compared without case and without a trailing
// dot.
func hostName(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	bad := errors.New("is not a host name, address or CIDR; write host:port, host, a CIDR such as 10.20.0.0/16, or \"*.example.org\"")
	if s == "" || len(s) > 253 {
		return "", bad
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", bad
		}
		for _, r := range label {
			if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_') {
				return "", bad
			}
		}
	}
	return s, nil
}

// normalName is how a host from a config or a dial is compared with an
// entry's name.
func normalName(host string) string { return strings.TrimSuffix(strings.ToLower(host), ".") }

// allowsName reports whether e lets a connection to host name on port.
func (e Entry) allowsName(host string, port int) bool {
	if e.name == "" || (e.port != 0 && e.port != port) {
		return false
	}
	host = normalName(host)
	if e.wild {
		return strings.HasSuffix(host, "."+e.name)
	}
	return host == e.name
}

// allowsAddr reports whether e lets a connection to address a on port.
func (e Entry) allowsAddr(a netip.Addr, port int) bool {
	if e.name != "" || (e.port != 0 && e.port != port) {
		return false
	}
	return e.prefix.Contains(a.Unmap())
}

// List is an allow-list, in the order it was written.
type List []Entry

// Allows reports whether the list lets the config name host (a host name
// or an address literal) on port: a name must be listed by name or by a
// wildcard, an address by an address or a CIDR. It is the static check;
// a Policy also checks the address each connection reaches.
func (l List) Allows(host string, port int) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return l.allowsAddr(a, port)
	}
	for _, e := range l {
		if e.allowsName(host, port) {
			return true
		}
	}
	return false
}

func (l List) allowsAddr(a netip.Addr, port int) bool {
	for _, e := range l {
		if e.allowsAddr(a, port) {
			return true
		}
	}
	return false
}

// Strings returns the entries as written.
func (l List) Strings() []string {
	out := make([]string, len(l))
	for i, e := range l {
		out[i] = e.text
	}
	return out
}

// IsAddress reports whether host is an address literal rather than a name.
func IsAddress(host string) bool {
	_, err := netip.ParseAddr(host)
	return err == nil
}

// IsLoopback reports whether host never leaves the machine: localhost or a
// loopback address. Any other name may resolve anywhere.
func IsLoopback(host string) bool {
	if strings.EqualFold(normalName(host), "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
