// Package freeport hands tests TCP ports for a node to listen on later.
//
// A test writes a listen address into a config before the node binds it, so
// the port must stay free in between. The usual trick, binding port 0 and
// closing, gets a port from the kernel's ephemeral range, the range every
// outgoing connection draws its local port from too: a test suite opens
// hundreds of connections to PostgreSQL, and one of them can take the port
// before the node binds it ("bind: address already in use", seen in a full
// run). Ports here come from below that range, which only explicit binds
// use, and each is reserved across the test binaries running at once by a
// lock file held until the process exits.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// lowest is where the ports handed out begin: clear of the well-known and
// commonly configured ports below it.
const lowest = 20000

var (
	mu sync.Mutex
	// held keeps the reservations' lock files open, and so locked, for the
	// life of the test binary; a port is never handed out twice in it.
	held = map[int]*os.File{}
)

// Addr returns host:port for a port that nothing on this machine is bound
// to now and that no other caller, in this process or another using this
// package, has been given. host is usually 127.0.0.1; the port is also free
// on every other address, so a node may bind it on 0.0.0.0.
func Addr(t testing.TB, host string) string {
	t.Helper()
	top := ephemeralStart()
	dir := filepath.Join(os.TempDir(), "mefor-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("freeport: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		port := lowest + rand.IntN(top-lowest)
		if _, taken := held[port]; taken {
			continue
		}
		f, ok := reserve(dir, port)
		if !ok {
			continue
		}
		// Free on every address, IPv4 and IPv6: a node given 0.0.0.0, or a
		// test's partner on another loopback address, must not collide.
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			f.Close() // in use by something that does not reserve: not ours
			continue
		}
		ln.Close()
		held[port] = f
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	t.Fatalf("freeport: no free port in %d-%d after 1000 tries", lowest, top-1)
	return ""
}

// reserve takes the lock file of port, without waiting. A lock held by a
// process that exited is released by the kernel, so a crashed test run
// reserves nothing for the next.
func reserve(dir string, port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// ephemeralStart is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err != nil || lo <= lowest+1000 {
		return 32768
	}
	return lo
}
