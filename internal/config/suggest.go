package config

import (
	"fmt"
	"strings"
)

// suggest returns the option closest to s, or "" when none is close enough
// to be a plausible typo.
func suggest(s string, options []string) string {
	best, bestDist := "", -1
	for _, o := range options {
		if strings.EqualFold(s, o) {
			return o
		}
		d := editDistance(s, o)
		if bestDist < 0 || d < bestDist {
			best, bestDist = o, d
		}
	}
	// Allow about one typo per three characters, so "fifoo" suggests "fifo"
	// but "xml" doesn't suggest "map".
	if bestDist >= 0 && bestDist <= max(1, len(s)/3) {
		return best
	}
	return ""
}

// didYouMean formats suggest's answer as the end of a message, quoting
// with q (%q for names, %s for keys).
func didYouMean(s string, options []string, verb string) string {
	if o := suggest(s, options); o != "" {
		return fmt.Sprintf("; did you mean "+verb+"?", o)
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
