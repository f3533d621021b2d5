package workers

import (
	"testing"
	"time"
)

// Executions started together must not yield together: each one's slice is
// at least Slice and at most a quarter more, and a hundred of them spread
// over more than a tenth of Slice.
func TestSlicesOfExecutionsSpread(t *testing.T) {
	const slice = 5 * time.Second
	var lo, hi time.Duration
	for i := range 100 {
		s := sliceOf(slice)
		if s < slice || s >= slice*5/4 {
			t.Fatalf("a slice of %v, want from %v to under %v", s, slice, slice*5/4)
		}
		if i == 0 {
			lo, hi = s, s
		}
		lo, hi = min(lo, s), max(hi, s)
	}
	if hi-lo < slice/10 {
		t.Errorf("100 executions' slices all within %v of each other (%v to %v): they would yield together", hi-lo, lo, hi)
	}
	if s := sliceOf(time.Nanosecond * 3); s != 3 {
		t.Errorf("a slice too short to shorten became %v", s)
	}
}
