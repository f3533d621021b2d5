package config

import (
	"math"
	"time"
)

// Retry is a destination's retry policy: exponential backoff with a cap.
type Retry struct {
	// MaxAttempts is the number of delivery attempts before a message is
	// given up on; 0 retries forever, which is what a destination that must
	// not lose messages wants. Defaults to 0.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt (the
	// backoff key in the file). Defaults to 1s.
	InitialBackoff time.Duration
	// Multiplier grows the wait after each further failure; 1 keeps it
	// constant. Defaults to 2.
	Multiplier float64
	// MaxBackoff caps the wait. Defaults to 5m.
	MaxBackoff time.Duration
}

// Backoff returns how long to wait after the given failed attempt, counting
// from 1: InitialBackoff after the first, growing by Multiplier, never more
// than MaxBackoff. Attempts below 1 count as 1.
func (r Retry) Backoff(attempt int) time.Duration {
	attempt = max(attempt, 1)
	limit := r.MaxBackoff
	if limit <= 0 {
		// A zero Retry has no cap; still keep the result representable.
		limit = math.MaxInt64
	}
	// Computing in float64 saturates instead of wrapping around: after
	// enough attempts the product is +Inf, which the cap handles.
	d := float64(r.InitialBackoff) * math.Pow(r.Multiplier, float64(attempt-1))
	if math.IsNaN(d) || d >= float64(limit) {
		return limit
	}
	return time.Duration(max(d, 0))
}

// Exhausted reports whether a message that has failed the given number of
// attempts should be given up on.
func (r Retry) Exhausted(attempts int) bool {
	return r.MaxAttempts > 0 && attempts >= r.MaxAttempts
}
