package main

import (
	"bytes"
	"testing"

	"github.com/mefor/mefor/testcontainers"
)

// TestMain is shared by every test of the CLI: in-process command tests and
// the end-to-end tests that run the built binary.
func TestMain(m *testing.M) { testcontainers.Main(m) }

// runOK runs the CLI in-process with args, fails the test unless it exits
// 0, and returns what it printed.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("%s: exit %d: %s", args[0], code, errb.String())
	}
	return out.String()
}
