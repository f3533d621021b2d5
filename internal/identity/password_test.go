package identity_test

import (
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/identity"
)

// cheap are argon2id parameters for tests: the race detector makes the
// default ones take seconds per hash.
var cheap = identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}

func TestPasswordHashIsArgon2idAndVerifies(t *testing.T) {
	t.Parallel()
	const pw = "correct horse battery"
	h, err := identity.HashPassword(identity.DefaultArgon2, pw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=65536,t=3,p=4$") || strings.Contains(h, pw) {
		t.Fatalf("hash %q is not the documented PHC string", h)
	}
	h, err = identity.HashPassword(cheap, pw)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pw   string
		want bool
	}{{pw, true}, {pw + " ", false}, {"", false}} {
		ok, err := identity.VerifyPassword(h, c.pw)
		if err != nil || ok != c.want {
			t.Errorf("verify %q: %v, %v; want %v", c.pw, ok, err, c.want)
		}
	}
	if h2, _ := identity.HashPassword(cheap, pw); h2 == h {
		t.Error("two hashes of one password are equal: no salt")
	}
}

func TestPasswordRules(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, pw string
		refused  bool
	}{
		{"alice", "short-pw", true},
		{"alice", "elevenchars", true},
		{"alice", "twelve chars", false},
		{"alice.example.org", "ALICE.EXAMPLE.ORG", true},
		{"alice.example.org", " alice.example.org ", true},
	} {
		err := identity.CheckPassword(c.name, c.pw)
		if (err != nil) != c.refused {
			t.Errorf("password for %s of %d characters: %v, want refused=%v", c.name, len(c.pw), err, c.refused)
		}
		if err != nil {
			if ie, ok := identity.IsInvalid(err); !ok || ie.Field != "password" || strings.Contains(err.Error(), c.pw) {
				t.Errorf("refusal %v does not name the field, or echoes the password", err)
			}
		}
	}
}
