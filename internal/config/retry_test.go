package config_test

import (
	"math"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

func TestRetryBackoff(t *testing.T) {
	r := config.Retry{InitialBackoff: time.Second, Multiplier: 2, MaxBackoff: 5 * time.Minute}
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{-1, time.Second}, // below 1 counts as the first attempt
		{0, time.Second},
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{9, 256 * time.Second},
		{10, 5 * time.Minute}, // 512s, capped
		{64, 5 * time.Minute},
		{100_000, 5 * time.Minute}, // 2^99999 overflows float64 to +Inf
		{math.MaxInt, 5 * time.Minute},
	}
	for _, tt := range tests {
		if got := r.Backoff(tt.attempt); got != tt.want {
			t.Errorf("Backoff(%d) = %v, want %v", tt.attempt, got, tt.want)
		}
	}

	constant := config.Retry{InitialBackoff: 3 * time.Second, Multiplier: 1, MaxBackoff: time.Minute}
	if got := constant.Backoff(1000); got != 3*time.Second {
		t.Errorf("multiplier 1: Backoff(1000) = %v, want 3s", got)
	}

	fractional := config.Retry{InitialBackoff: time.Second, Multiplier: 1.5, MaxBackoff: time.Minute}
	if got := fractional.Backoff(3); got != 2250*time.Millisecond {
		t.Errorf("multiplier 1.5: Backoff(3) = %v, want 2.25s", got)
	}

	// Without a cap the wait saturates instead of wrapping around to a
	// negative duration.
	uncapped := config.Retry{InitialBackoff: time.Hour, Multiplier: 10}
	for _, attempt := range []int{10, 20, 1000} {
		if got := uncapped.Backoff(attempt); got != math.MaxInt64 {
			t.Errorf("uncapped: Backoff(%d) = %v, want the largest duration", attempt, got)
		}
	}
}

func TestRetryExhausted(t *testing.T) {
	forever := config.Retry{MaxAttempts: 0}
	if forever.Exhausted(1_000_000) {
		t.Error("max_attempts 0 should retry forever")
	}
	three := config.Retry{MaxAttempts: 3}
	for attempts, want := range []bool{false, false, false, true, true} {
		if got := three.Exhausted(attempts); got != want {
			t.Errorf("Exhausted(%d) = %v, want %v", attempts, got, want)
		}
	}
}
