package admission

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Sources is a list of source addresses and networks a listener accepts
// connections from. A nil *Sources accepts every source.
type Sources struct {
	prefixes []netip.Prefix
}

// ParseSource reads one entry of an allow list: an IP address
// (10.1.2.3, fd00::5) or a network in CIDR notation (10.1.0.0/16). Host
// names are refused: a name resolves to other addresses over time, and an
// allow list must say exactly who may connect. The error says what to
// write instead.
func ParseSource(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("is empty; write an address (10.1.2.3) or a network (10.1.0.0/16)")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a network in CIDR notation (e.g. 10.1.0.0/16 or fd00::/64)", s)
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q has an IPv6 zone; write the network without %%zone", s)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		if m := p.Masked(); m != p {
			return netip.Prefix{}, fmt.Errorf("%q has address bits set past its /%d; did you mean %s?", s, p.Bits(), m)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		if ap, perr := netip.ParseAddrPort(s); perr == nil {
			return netip.Prefix{}, fmt.Errorf("%q has a port; write the address alone (%s): every port of it is the same sender", s, ap.Addr())
		}
		if looksLikeName(s) {
			return netip.Prefix{}, fmt.Errorf("%q is a host name; names are not allowed here, since they may resolve to other addresses later: "+
				"write the sender's address (e.g. 10.1.2.3) or its network (e.g. 10.1.0.0/16)", s)
		}
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or network (e.g. 10.1.2.3, fd00::5 or 10.1.0.0/16)", s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q has an IPv6 zone; write the address without %%zone", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// looksLikeName reports whether s reads as a host name rather than a
// mistyped address: it has a letter and no colon.
func looksLikeName(s string) bool {
	return !strings.Contains(s, ":") && strings.IndexFunc(s, func(r rune) bool {
		return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
	}) >= 0
}

// NewSources parses an allow list. An empty list is an error: it would
// refuse every sender, which is never what a config means.
func NewSources(entries []string) (*Sources, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf("the allow list is empty")
	}
	s := &Sources{}
	for i, e := range entries {
		p, err := ParseSource(e)
		if err != nil {
			return nil, fmt.Errorf("entry %d %w", i, err)
		}
		s.prefixes = append(s.prefixes, p)
	}
	return s, nil
}

// Allows reports whether a connection from addr may be accepted. An
// IPv4 address reached through an IPv6 socket (::ffff:10.1.2.3) is
// compared as the IPv4 address it is.
func (s *Sources) Allows(addr netip.Addr) bool {
	if s == nil {
		return true
	}
	addr = addr.Unmap().WithZone("")
	for _, p := range s.prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// addrOf returns the IP address of a connection's remote end, and false
// when it has none (a pipe, a Unix socket).
func addrOf(a net.Addr) (netip.Addr, bool) {
	switch v := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(v.IP)
		return ip.Unmap(), ok
	case nil:
		return netip.Addr{}, false
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}
