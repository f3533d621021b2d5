package main

import (
	"testing"

	"github.com/mefor/mefor/testcontainers"
)

// TestMain is shared by every test of the CLI: in-process command tests and
// the end-to-end tests that run the built binary.
func TestMain(m *testing.M) { testcontainers.Main(m) }
