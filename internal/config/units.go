package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseDuration parses a Go duration such as 250ms or 5m. A bare number is
// refused rather than read as nanoseconds (time.Duration's unit), which is
// never what someone writing "timeout: 30" means.
func parseDuration(s string) (time.Duration, error) {
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return 0, fmt.Errorf("%q needs a unit: write %ss for seconds or %sms for milliseconds", s, s, s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; use a number with a unit such as 250ms, 30s or 5m", s)
	}
	return d, nil
}

// parseSize parses a byte count: a plain number of bytes, or a number with
// a KiB, MiB or GiB suffix. Units are binary only: "1MB" is ambiguous (10^6
// or 2^20 bytes?), so it is refused with a hint.
func parseSize(s string) (int64, error) {
	num, unit := s, ""
	if i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		num, unit = s[:i], strings.TrimSpace(s[i:])
	}
	var mult int64
	switch unit {
	case "", "B":
		mult = 1
	case "KiB":
		mult = 1 << 10
	case "MiB":
		mult = 1 << 20
	case "GiB":
		mult = 1 << 30
	default:
		if fix := binaryUnit(unit); fix != "" && num != "" {
			return 0, fmt.Errorf("%q: sizes use binary units; did you mean %s%s?", s, num, fix)
		}
		return 0, fmt.Errorf("%q is not a size; use a whole number of bytes or a number with KiB, MiB or GiB, e.g. 1MiB", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size; use a whole number of bytes or a number with KiB, MiB or GiB, e.g. 1MiB", s)
	}
	if n > (1<<63-1)/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

// binaryUnit maps a decimal or abbreviated unit (MB, m, kb) to the binary
// unit it most likely meant.
func binaryUnit(unit string) string {
	switch strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "B")) {
	case "K", "KI":
		return "KiB"
	case "M", "MI":
		return "MiB"
	case "G", "GI":
		return "GiB"
	}
	return ""
}
