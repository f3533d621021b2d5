package testcontainers

import (
	"io"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
)

// RemoteURL is the database's URL as a client on another host would write
// it: its host is a forwarder on one of this machine's non-loopback
// addresses (the server listens on loopback only), so rules that treat
// loopback as trusted see a remote database. The count is of connections
// the forwarder accepted, to prove a refusal connected nowhere. The test is
// skipped on a machine without such an address.
func (db *DB) RemoteURL(t testing.TB) (string, *atomic.Int32) {
	t.Helper()
	var ip net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("no non-loopback IPv4 address on this machine")
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	conns := Forward(t, ln, u.Host)
	u.Host = ln.Addr().String()
	return u.String(), conns
}

// Forward copies every connection ln accepts to target, both ways, until
// the test ends, and counts the connections.
func Forward(t testing.TB, ln net.Listener, target string) *atomic.Int32 {
	t.Cleanup(func() { ln.Close() })
	conns := new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	return conns
}
