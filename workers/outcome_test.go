package workers

import (
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
)

func TestJudge(t *testing.T) {
	dest := func(mod func(*config.Destination)) *config.Destination {
		d := &config.Destination{Type: config.DestinationHTTP, OnReject: config.RejectDeadLetter, OnClientError: config.ClientErrorDeadLetter,
			Retry: config.Retry{InitialBackoff: time.Second, Multiplier: 2, MaxBackoff: time.Minute}}
		if mod != nil {
			mod(d)
		}
		return d
	}
	for _, tt := range []struct {
		name     string
		dest     *config.Destination
		res      connector.Result
		attempts int
		dead     bool
		backoff  time.Duration
	}{
		{"503 backs off by policy", dest(nil), connector.Result{Outcome: connector.OutcomeHTTPServerError}, 3, false, 4 * time.Second},
		{"Retry-After is the next wait", dest(nil), connector.Result{Outcome: connector.OutcomeHTTPServerError, RetryAfter: 7 * time.Second}, 1, false, 7 * time.Second},
		{"Retry-After bounded by max_backoff", dest(nil), connector.Result{Outcome: connector.OutcomeHTTPThrottled, RetryAfter: time.Hour}, 1, false, time.Minute},
		{"400 dead-letters by default", dest(nil), connector.Result{Outcome: connector.OutcomeHTTPClientError, AckCode: "400"}, 1, true, time.Second},
		{"400 retried with on_client_error: retry", dest(func(d *config.Destination) { d.OnClientError = config.ClientErrorRetry }),
			connector.Result{Outcome: connector.OutcomeHTTPClientError, AckCode: "400"}, 1, false, time.Second},
		{"max_attempts", dest(func(d *config.Destination) { d.Retry.MaxAttempts = 3 }), connector.Result{Outcome: connector.OutcomeTimeout}, 3, true, 4 * time.Second},
		{"AR dead-letters by default", dest(nil), connector.Result{Outcome: connector.OutcomeAR, AckCode: "AR"}, 1, true, time.Second},
		{"unwritable file name dead-letters at once", dest(nil), connector.Result{Outcome: connector.OutcomeBadName, Error: "bad-name: x"}, 1, true, time.Second},
		{"delivered", dest(nil), connector.Result{OK: true, Outcome: connector.OutcomeDelivered}, 1, false, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(tt.dest, tt.res, tt.attempts)
			if v.dead != tt.dead || v.backoff != tt.backoff {
				t.Fatalf("got dead %v backoff %s, want dead %v backoff %s", v.dead, v.backoff, tt.dead, tt.backoff)
			}
			if v.dead && tt.res.Outcome == connector.OutcomeHTTPClientError && v.reason != "partner refused the request (HTTP 400); on_client_error: dead-letter" {
				t.Fatalf("reason %q", v.reason)
			}
		})
	}
}
