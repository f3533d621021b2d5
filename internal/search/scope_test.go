package search_test

import (
	"path"
	"testing"

	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/testcontainers"
)

// A scope applied in SQL keeps exactly the channels path.Match keeps (the
// rule identity.Principal.SeesChannel states), for every kind of pattern
// and for names holding characters regexes give meaning to.
func TestChannelRegexpsAgreeWithPathMatch(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	patterns := []string{"lab-*", "adt", "lab-?", "[a-c]dt", "[^a]dt", "x.y", `a\*b`, "*", "l[ab]b-*", "(re)+", "a|b", "^adt$"}
	names := []string{"lab-a", "lab-", "lab-micro", "adt", "bdt", "ddt", "adt2", "xdt", "x.y", "xzy", "a*b", "ab", "lab", "(re)+", "re", "a|b", "a", "^adt$", "lbb-1", "ADT"}
	res, err := search.ChannelRegexps(patterns)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range patterns {
		for _, n := range names {
			want, _ := path.Match(p, n)
			var got bool
			if err := db.Pool.QueryRow(t.Context(), "SELECT $1::text ~ $2", n, res[i]).Scan(&got); err != nil {
				t.Fatalf("%q as %q: %v", p, res[i], err)
			}
			if got != want {
				t.Errorf("pattern %q, channel %q: SQL says %v, path.Match %v (regexp %s)", p, n, got, want, res[i])
			}
		}
	}
	if _, err := search.ChannelRegexps([]string{"lab-["}); err == nil {
		t.Error("an unterminated class was translated")
	}
}
