package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseWhen reads a --since or --until value: an RFC 3339 time
// (2024-05-01T08:00:00Z, or with an offset), a date (2024-05-01, midnight
// local time), or a duration back from now (90s, 2h, 7d).
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.Local); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--%s %q is not a time: give an RFC 3339 time such as 2024-05-01T08:00:00Z, a date such as 2024-05-01, or how long ago such as 2h, 90m or 7d", flag, s)
}
