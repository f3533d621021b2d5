package search

import (
	"fmt"
	"strings"
	"time"
)

// Cursor is where a listing's next page starts: after the last message
// of the page before, in the listing's order.
type Cursor struct {
	ID         int64
	ReceivedAt time.Time
}

// ChannelRegexps turns channel patterns (path.Match's syntax, as users'
// scopes hold them) into anchored PostgreSQL regular expressions, so that
// a scope is applied by the query itself: a page then holds only messages
// in scope, and its limit and next cursor count only those. Every literal
// character is written as a \U escape, so no character of a channel name
// means anything to the regex. A pattern path.Match cannot read is
// refused (identity refuses them when they are stored).
func ChannelRegexps(patterns []string) ([]string, error) {
	out := make([]string, 0, len(patterns))
	for _, p := range patterns {
		re, err := channelRegexp(p)
		if err != nil {
			return nil, fmt.Errorf("channel pattern %q: %w", p, err)
		}
		out = append(out, re)
	}
	return out, nil
}

func channelRegexp(p string) (string, error) {
	rs := []rune(p)
	var b strings.Builder
	b.WriteString("^")
	lit := func(r rune) { fmt.Fprintf(&b, `\U%08x`, r) }
	// char reads one character of a class at i (escaped or not).
	char := func(i int) (rune, int, error) {
		if i < len(rs) && rs[i] == '\\' {
			i++
		}
		if i >= len(rs) {
			return 0, i, fmt.Errorf("unterminated class")
		}
		return rs[i], i + 1, nil
	}
	for i := 0; i < len(rs); i++ {
		switch rs[i] {
		case '*':
			b.WriteString("[^/]*")
		case '?':
			b.WriteString("[^/]")
		case '\\':
			i++
			if i >= len(rs) {
				return "", fmt.Errorf("trailing backslash")
			}
			lit(rs[i])
		case '[':
			i++
			b.WriteString("[")
			if i < len(rs) && rs[i] == '^' {
				b.WriteString("^")
				i++
			}
			n := 0
			for ; i < len(rs) && (rs[i] != ']' || n == 0); n++ {
				lo, next, err := char(i)
				if err != nil {
					return "", err
				}
				lit(lo)
				i = next
				if i < len(rs) && rs[i] == '-' {
					hi, next, err := char(i + 1)
					if err != nil {
						return "", err
					}
					b.WriteString("-")
					lit(hi)
					i = next
				}
			}
			if i >= len(rs) || n == 0 {
				return "", fmt.Errorf("unterminated class")
			}
			b.WriteString("]")
		default:
			lit(rs[i])
		}
	}
	b.WriteString("$")
	return b.String(), nil
}
