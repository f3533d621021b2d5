package pipeline_test

import (
	"testing"

	"github.com/mefor/mefor/testcontainers/fixtures"
)

// fixture is a test's own database and the helpers that query it; the
// tests of a concern add the rows they need as methods.
type fixture struct{ *fixtures.DBTest }

func newFixture(t *testing.T) *fixture { return &fixture{fixtures.NewDBTest(t)} }
