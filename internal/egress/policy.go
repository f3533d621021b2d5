package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Resolver looks up a host name's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure NewPolicy.
type Options struct {
	// Resolver resolves the names pinned. Defaults to net.DefaultResolver,
	// which is also what connections resolve with; tests give another to
	// pin other addresses than a connection then reaches.
	Resolver Resolver
	// OnRefuse is called once for each connection refused (not for each
	// address tried), for the caller to count and log it.
	OnRefuse func(*RefusedError)
	// LookupTimeout bounds each name's resolution. Defaults to 5s.
	LookupTimeout time.Duration
}

// Policy is an allow-list with the addresses its names were pinned to. A
// nil *Policy lets every connection through. It is safe for concurrent
// use.
type Policy struct {
	list List
	opts Options

	mu   sync.Mutex
	pins map[string][]netip.Addr // by normalName
}

// NewPolicy builds the policy of list, resolving and pinning hosts, the
// host names the config connects to (addresses and names the list does
// not allow are skipped). It returns an error for each name that did not
// resolve: its first connection pins it instead.
func NewPolicy(ctx context.Context, list List, hosts []string, opts Options) (*Policy, []error) {
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.LookupTimeout <= 0 {
		opts.LookupTimeout = 5 * time.Second
	}
	p := &Policy{list: slices.Clone(list), opts: opts, pins: map[string][]netip.Addr{}}
	var names []string
	for _, h := range hosts {
		n := normalName(h)
		if !IsAddress(h) && p.allowsNameOnAnyPort(n) && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() { _, errs[i] = p.pin(ctx, n) })
	}
	wg.Wait()
	return p, slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

// Pinned returns the addresses name was pinned to, sorted; none when it
// was not (yet) resolved.
func (p *Policy) Pinned(name string) []netip.Addr {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.pins[normalName(name)])
}

func (p *Policy) allowsNameOnAnyPort(name string) bool {
	for _, e := range p.list {
		if e.name != "" && (e.wild && strings.HasSuffix(name, "."+e.name) || !e.wild && name == e.name) {
			return true
		}
	}
	return false
}

// pin resolves name and keeps its addresses, unless it has some already.
func (p *Policy) pin(ctx context.Context, name string) ([]netip.Addr, error) {
	p.mu.Lock()
	got, ok := p.pins[name]
	p.mu.Unlock()
	if ok {
		return got, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.LookupTimeout)
	defer cancel()
	addrs, err := p.opts.Resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("egress: resolve %s to pin its addresses: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("egress: resolve %s to pin its addresses: no address", name)
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev, ok := p.pins[name]; ok { // pinned meanwhile by another connection
		return prev, nil
	}
	p.pins[name] = addrs
	return addrs, nil
}

// RefusedError is a connection the policy refused: nothing was written to
// it. It names what connected and where, never what it was to carry.
type RefusedError struct {
	// Target names what connected, e.g. destination:lab.
	Target string
	// Host is the host the config names (a name or an address).
	Host string
	// Addr is the address:port the connection would have reached.
	Addr string
	// Pinned are the addresses Host was pinned to, when it is a listed
	// name.
	Pinned []netip.Addr
	listed bool
}

func (e *RefusedError) Error() string { return "egress: " + e.Detail() }

// Detail is the error without its "egress: " prefix, for a message that
// already says egress.
func (e *RefusedError) Detail() string {
	where := e.Addr
	if e.Host != "" && !strings.HasPrefix(e.Addr, e.Host+":") && !strings.HasPrefix(e.Addr, "["+e.Host+"]:") {
		where += " (" + e.Host + ")"
	}
	if !e.listed {
		return fmt.Sprintf("%s may not connect to %s: it is not in egress.allow", e.Target, where)
	}
	pinned := "none, it did not resolve"
	if len(e.Pinned) > 0 {
		s := make([]string, len(e.Pinned))
		for i, a := range e.Pinned {
			s[i] = a.String()
		}
		pinned = strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s may not connect to %s: the address is not one %s had when the config was loaded (%s) "+
		"nor inside a listed CIDR; if the host moved, run mefor reload, and if its addresses rotate, list their network in egress.allow",
		e.Target, where, e.Host, pinned)
}

// DialFunc opens a connection, like net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer returns the dial function of target, which names it in
// refusals (e.g. destination:lab). Each address a connection reaches is
// checked before anything is written: it must be inside a listed address
// or CIDR, or one of the pinned addresses of a listed name, which is the
// host of the address dialled, or, when hosts are given, one of hosts (for
// a client that resolves names itself and dials addresses, as pgx does).
func (p *Policy) Dialer(target string, hosts ...string) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p == nil || strings.HasPrefix(network, "unix") {
			// A Unix socket never leaves the machine.
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		names := hosts
		if len(names) == 0 {
			names = []string{host}
		}
		for _, h := range names {
			if n := normalName(h); !IsAddress(h) && p.allowsNameOnAnyPort(n) {
				// A name that did not resolve at load is pinned now; a
				// failure leaves the check to refuse it.
				_, _ = p.pin(ctx, n)
			}
		}
		var refused atomic.Pointer[RefusedError]
		d := &net.Dialer{ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
			if err := p.check(target, names, address); err != nil {
				refused.CompareAndSwap(nil, err)
				return err
			}
			return nil
		}}
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			return c, nil
		}
		// An address refused is what to report, even when another
		// address of the name failed otherwise.
		if r := refused.Load(); r != nil {
			if p.opts.OnRefuse != nil {
				p.opts.OnRefuse(r)
			}
			return nil, r
		}
		return nil, err
	}
}

// check decides whether a connection of target to address, resolved from
// one of names, may go ahead.
func (p *Policy) check(target string, names []string, address string) *RefusedError {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Target: target, Host: names[0], Addr: address}
	}
	a, port := ap.Addr().Unmap(), int(ap.Port())
	if p.list.allowsAddr(a, port) {
		return nil
	}
	refused := &RefusedError{Target: target, Host: names[0], Addr: net.JoinHostPort(a.String(), strconv.Itoa(port))}
	for _, h := range names {
		if IsAddress(h) || !p.list.Allows(h, port) {
			continue
		}
		pinned := p.Pinned(h)
		if slices.Contains(pinned, a) {
			return nil
		}
		refused.Host, refused.Pinned, refused.listed = h, pinned, true
	}
	return refused
}

// IsRefused reports whether err is, or wraps, a connection the policy
// refused.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// Gate holds the policy in force, swapped at each reload; the zero Gate
// lets every connection through. Dial functions from Gate.Dialer read it
// at each connection, so a reload applies to the next one.
type Gate struct {
	cur atomic.Pointer[Policy]
}

// Store puts p in force.
func (g *Gate) Store(p *Policy) { g.cur.Store(p) }

// Load returns the policy in force.
func (g *Gate) Load() *Policy { return g.cur.Load() }

// Dialer is Policy.Dialer of the policy in force at each connection.
func (g *Gate) Dialer(target string, hosts ...string) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return g.Load().Dialer(target, hosts...)(ctx, network, addr)
	}
}
