package tlsconf

import (
	"testing"
	"time"
)

// A certificate is due for renewal from the moment it expires within the
// window, that moment included, and stays due once it has expired.
func TestRenewSoonBoundary(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	window := 30 * 24 * time.Hour
	for _, tc := range []struct {
		notAfter time.Time
		want     bool
	}{
		{now.Add(window + time.Second), false},
		{now.Add(window), true},
		{now.Add(time.Hour), true},
		{now.Add(-time.Hour), true},
	} {
		if got := RenewSoon(tc.notAfter, now, window); got != tc.want {
			t.Errorf("RenewSoon(expires in %s) = %v, want %v", tc.notAfter.Sub(now), got, tc.want)
		}
	}
}
