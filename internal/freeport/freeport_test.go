package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The ports handed out are outside the range outgoing connections draw
// from, distinct, bindable on every address, and reserved against another
// test binary for as long as this one runs.
func TestAddr(t *testing.T) {
	top := ephemeralStart()
	seen := map[string]bool{}
	for range 50 {
		addr := Addr(t, "127.0.0.1")
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lowest || port >= top {
			t.Fatalf("port %d outside %d-%d", port, lowest, top-1)
		}
		// Another binary's attempt: a second open file description of the
		// same lock cannot take it.
		if f, ok := reserve(filepath.Join(os.TempDir(), "mefor-test-ports"), port); ok {
			f.Close()
			t.Fatalf("port %d reserved again while this binary holds it", port)
		}
		ln, err := net.Listen("tcp", "0.0.0.0:"+p)
		if err != nil {
			t.Fatalf("port %d not bindable on 0.0.0.0: %v", port, err)
		}
		ln.Close()
	}
}
