package config_test

import (
	"os"
	"testing"

	"github.com/mefor/mefor/internal/config"
)

// FuzzParse checks that no input makes Parse panic or return a Config
// along with an error.
func FuzzParse(f *testing.F) {
	quickstart, err := os.ReadFile("../../examples/quickstart/mefor.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(quickstart)
	f.Add([]byte(minimal))
	f.Add([]byte("a: &x\n  <<: *x\n"))
	f.Add([]byte("destinations:\n  a: &r {retry: {backoff: 1s}}\n  b:\n    <<: [*r, *r]\n"))
	f.Add([]byte("channels: {a: {inbound: {mllp: {listen: \"${X:-:1}\"}}, routes: [{destinations: [a]}]}}\n"))
	getenv := func(string) (string, bool) { return "", false }
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := config.Parse("fuzz.yaml", data, getenv)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c, err)
		}
		if err != nil && err.Error() == "" {
			t.Fatal("empty error text")
		}
	})
}
