package apiclient_test

import (
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/apiclient"
)

// A bearer token never goes over plain HTTP to another host; a missing URL
// or token says which variable sets it.
func TestNewRefusesPlainHTTPOffLoopback(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url, token, says string
	}{
		{"http://mefor.example.org:8443", "mefor_t_x", "plain http"},
		{"http://10.0.0.5:8080", "mefor_t_x", "plain http"},
		{"", "mefor_t_x", "MEFOR_API_URL"},
		{"https://mefor.example.org:8443", "", "MEFOR_API_TOKEN"},
		{"mefor.example.org:8443", "mefor_t_x", "want https://host:port"},
		{"http://127.0.0.1:8080", "mefor_t_x", ""},
		{"http://localhost:8080", "mefor_t_x", ""},
		{"https://mefor.example.org:8443/", "mefor_t_x", ""},
	} {
		_, err := apiclient.New(apiclient.Options{URL: c.url, Token: c.token})
		if c.says == "" {
			if err != nil {
				t.Errorf("%q: %v", c.url, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q token %q: %v, want it to say %q", c.url, c.token, err, c.says)
		}
	}
}
