package config_test

import (
	"strings"
	"testing"
	"time"
)

// The api: section: HTTPS unless loopback or plaintext: true, as for MLLP
// listeners; its allow list, caps and session limits are checked, naming
// the line and field.
func TestAPISection(t *testing.T) {
	doc := func(api string) string {
		return `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
api:
` + api
	}
	for _, tt := range []struct {
		api   string
		field string // "" : accepted
		says  string
	}{
		{api: "  listen: 0.0.0.0:8443\n", field: "api.listen", says: "would serve the API in plain HTTP to the network"},
		{api: "  listen: mefor-a.example.org:8443\n", field: "api.listen", says: "would serve the API in plain HTTP"},
		{api: "  listen: 0.0.0.0:8443\n  plaintext: true\n"},
		{api: "  listen: 127.0.0.1:8080\n"},
		{api: "  listen: 0.0.0.0:8443\n  tls: {cert_file: api.crt, key_file: api.key}\n"},
		{api: "  listen: 0.0.0.0:8443\n  tls: {cert_file: api.crt}\n", field: "api.tls.key_file", says: "is required"},
		{api: "  listen: 0.0.0.0:8443\n  plaintext: true\n  tls: {cert_file: api.crt, key_file: api.key}\n", field: "api.plaintext", says: "a tls: block is set too"},
		{api: "  plaintext: true\n", field: "api.listen", says: "is required"},
		{api: "  listen: 127.0.0.1:8080\n  allow: [ops.example.org]\n", field: "api.allow", says: "ops.example.org"},
		{api: "  listen: 127.0.0.1:8080\n  session_idle: 1h\n  session_max: 30m\n", field: "api.session_max", says: "must be at least session_idle"},
		{api: "  listen: 127.0.0.1:8080\n  max_connections: 0\n", field: "api.max_connections", says: "must be at least 1"},
	} {
		_, err := parse(t, doc(tt.api), nil)
		if tt.field == "" {
			if err != nil {
				t.Errorf("%q: %v", tt.api, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), ": "+tt.field+" ") || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%q: %v, want an error at %s saying %q", tt.api, err, tt.field, tt.says)
		}
	}
	c, err := parse(t, doc("  listen: 127.0.0.1:8080\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := c.API; a == nil || a.SessionIdle != 30*time.Minute || a.SessionMax != 12*time.Hour || a.MaxConnections != 256 || a.MaxConnectionsPerIP != 16 {
		t.Fatalf("api defaults: %+v", c.API)
	}
}
