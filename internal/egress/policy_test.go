package egress_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/egress"
)

// listener counts the connections that reached a real TCP socket.
type listener struct {
	ln       net.Listener
	accepted chan net.Conn
}

func listen(t *testing.T) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{ln: ln, accepted: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted <- c
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return l
}

func (l *listener) port() string {
	_, p, _ := net.SplitHostPort(l.ln.Addr().String())
	return p
}

// next returns the next connection the listener accepted, which must
// come from the local address of want.
func (l *listener) next(t *testing.T, want net.Conn) {
	t.Helper()
	select {
	case c := <-l.accepted:
		defer c.Close()
		if c.RemoteAddr().String() != want.LocalAddr().String() {
			t.Fatalf("the listener's next connection came from %s, not from the allowed dial (%s): a refused dial reached it",
				c.RemoteAddr(), want.LocalAddr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the allowed connection never reached the listener")
	}
}

// resolver answers LookupNetIP from a table, as a DNS server whose answer
// has changed since would.
type resolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	fail    map[string]bool
	lookups atomic.Int32
}

func (r *resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[host] {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return r.answers[host], nil
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// A name listed in egress.allow whose address at connect time is not the
// one it had when the policy was built is refused before the connection is
// made: the listener behind the new address never sees it, OnRefuse is
// called once, and the error names the target, the addresses and the fix.
// The same dial with the name pinned to its real address connects.
func TestDialRefusesAnAddressTheNameWasNotPinnedTo(t *testing.T) {
	ctx := context.Background()
	l := listen(t)
	list := parseList(t, "localhost")
	// When the config was loaded, localhost answered 127.0.0.2; now the
	// system resolves it to 127.0.0.1, where the listener is.
	var refusals []*egress.RefusedError
	stale, errs := egress.NewPolicy(ctx, list, []string{"localhost"}, egress.Options{
		Resolver: &resolver{answers: map[string][]netip.Addr{"localhost": addrs("127.0.0.2")}},
		OnRefuse: func(r *egress.RefusedError) { refusals = append(refusals, r) },
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	_, err := stale.Dialer("destination:lab")(ctx, "tcp", "localhost:"+l.port())
	var refused *egress.RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("dial with a changed answer: %v, want a RefusedError", err)
	}
	for _, want := range []string{"destination:lab", "127.0.0.1:" + l.port(), "localhost", "127.0.0.2", "mefor reload", "CIDR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal does not say %q: %v", want, err)
		}
	}
	if len(refusals) != 1 || refusals[0].Target != "destination:lab" {
		t.Errorf("OnRefuse calls: %v, want one for destination:lab", refusals)
	}

	fresh, _ := egress.NewPolicy(ctx, list, []string{"localhost"}, egress.Options{})
	c, err := fresh.Dialer("destination:lab")(ctx, "tcp", "localhost:"+l.port())
	if err != nil {
		t.Fatalf("dial with the name pinned to its real address: %v", err)
	}
	defer c.Close()
	l.next(t, c)
}

// A listed CIDR lets a name's new address through (rotating answers), and
// an address not listed is refused whatever the port, or with a port other
// than its entry's.
func TestDialChecksAddressesAndPorts(t *testing.T) {
	ctx := context.Background()
	l := listen(t)
	res := &resolver{answers: map[string][]netip.Addr{"localhost": addrs("127.0.0.2")}}
	rotating, _ := egress.NewPolicy(ctx, parseList(t, "localhost", "127.0.0.0/8"), []string{"localhost"}, egress.Options{Resolver: res})
	c, err := rotating.Dialer("destination:lab")(ctx, "tcp", "localhost:"+l.port())
	if err != nil {
		t.Fatalf("a name's address inside a listed CIDR: %v", err)
	}
	c.Close()
	l.next(t, c)

	for _, entry := range []string{"127.0.0.2", "127.0.0.1:1", "localhost"} {
		p, _ := egress.NewPolicy(ctx, parseList(t, entry), nil, egress.Options{Resolver: res})
		_, err := p.Dialer("destination:lab")(ctx, "tcp", "127.0.0.1:"+l.port())
		if !egress.IsRefused(err) || !strings.Contains(err.Error(), "not in egress.allow") {
			t.Errorf("allow [%s], dial 127.0.0.1:%s: %v, want refused as not listed", entry, l.port(), err)
		}
	}
	p, _ := egress.NewPolicy(ctx, parseList(t, "127.0.0.1:"+l.port()), nil, egress.Options{})
	c, err = p.Dialer("destination:lab")(ctx, "tcp", "127.0.0.1:"+l.port())
	if err != nil {
		t.Fatalf("a listed address and port: %v", err)
	}
	c.Close()
	l.next(t, c)

	// No policy: no egress: section, anything goes.
	var none *egress.Policy
	c, err = none.Dialer("destination:lab")(ctx, "tcp", "127.0.0.1:"+l.port())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	l.next(t, c)
}

// A name that did not resolve when the policy was built is pinned at its
// first connection, once; the answer then holds.
func TestNameUnresolvedAtLoadIsPinnedAtFirstConnection(t *testing.T) {
	ctx := context.Background()
	l := listen(t)
	res := &resolver{answers: map[string][]netip.Addr{"localhost": addrs("127.0.0.1")}, fail: map[string]bool{"localhost": true}}
	p, errs := egress.NewPolicy(ctx, parseList(t, "localhost"), []string{"localhost"}, egress.Options{Resolver: res})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "localhost") {
		t.Fatalf("errors of a name that did not resolve: %v", errs)
	}
	if got := p.Pinned("localhost"); len(got) != 0 {
		t.Fatalf("pinned %v without an answer", got)
	}
	res.mu.Lock()
	res.fail = nil
	res.mu.Unlock()
	for range 2 {
		c, err := p.Dialer("destination:lab")(ctx, "tcp", "localhost:"+l.port())
		if err != nil {
			t.Fatalf("dial once the name resolves: %v", err)
		}
		c.Close()
		l.next(t, c)
	}
	if n := res.lookups.Load(); n != 2 {
		t.Errorf("%d lookups, want 2: the failed one at load and one at the first connection", n)
	}
}

// A client that resolves names itself and dials addresses (pgx) names the
// hosts its addresses come from.
func TestDialerWithHostsChecksTheirPins(t *testing.T) {
	ctx := context.Background()
	l := listen(t)
	list := parseList(t, "localhost")
	good, _ := egress.NewPolicy(ctx, list, []string{"localhost"}, egress.Options{
		Resolver: &resolver{answers: map[string][]netip.Addr{"localhost": addrs("127.0.0.1")}}})
	c, err := good.Dialer("reference_set:lab-codes", "localhost")(ctx, "tcp", "127.0.0.1:"+l.port())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	l.next(t, c)

	bad, _ := egress.NewPolicy(ctx, list, []string{"localhost"}, egress.Options{
		Resolver: &resolver{answers: map[string][]netip.Addr{"localhost": addrs("127.0.0.2")}}})
	if _, err := bad.Dialer("reference_set:lab-codes", "localhost")(ctx, "tcp", "127.0.0.1:"+l.port()); !egress.IsRefused(err) {
		t.Fatalf("an address the source's host was not pinned to: %v", err)
	}
}
