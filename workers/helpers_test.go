package workers_test

import (
	"testing"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// adtToOut is a config whose channel adt, listening on a free loopback
// address, routes everything to the MLLP destination out, with extra
// (top-level sections) after them. Its ${...} references are looked up in
// env.
func adtToOut(t *testing.T, extra string, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("t.yaml", []byte(`
channels:
  adt:
    inbound: {mllp: {listen: `+fixtures.FreeAddr(t)+`}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`+extra), func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
