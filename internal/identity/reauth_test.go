package identity_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A re-authentication is fresh for ReauthWindow by the store's clock; a
// wrong password there counts towards the lockout as a failed login
// does, so a stolen session cannot guess the password through it; a user
// without a second factor cannot re-authenticate.
func TestReauthWindowLockoutAndSecondFactor(t *testing.T) {
	clock := &fixtures.Clock{}
	f := newFixture(t, identity.Options{Now: clock.Now})
	secret, _ := f.add("alice", identity.RoleAdmin)
	l, err := f.store.Login(f.Ctx, identity.LoginRequest{Username: "alice", Password: password, TOTP: code(t, secret)})
	if err != nil {
		t.Fatal(err)
	}
	sid := l.Principal.SessionID
	if fresh, err := f.store.ReauthFresh(f.Ctx, sid); err != nil || fresh {
		t.Fatalf("fresh before any re-authentication: %v %v", fresh, err)
	}
	clock.Advance(30 * time.Second)
	c, _ := identity.TOTPCode(secret, clock.Now())
	if err := f.store.Reauth(f.Ctx, identity.ReauthRequest{SessionID: sid, Password: password, TOTP: c}); err != nil {
		t.Fatal(err)
	}
	if fresh, err := f.store.ReauthFresh(f.Ctx, sid); err != nil || !fresh {
		t.Fatalf("not fresh right after: %v %v", fresh, err)
	}
	clock.Advance(identity.ReauthWindow + time.Second)
	if fresh, _ := f.store.ReauthFresh(f.Ctx, sid); fresh {
		t.Fatal("fresh past the window")
	}

	for i := range identity.LockoutFailures {
		if err := f.store.Reauth(f.Ctx, identity.ReauthRequest{SessionID: sid, Password: "wrong password " + string(rune('a'+i))}); !errors.Is(err, identity.ErrReauthFailed) {
			t.Fatalf("attempt %d: %v", i+1, err)
		}
	}
	clock.Advance(30 * time.Second)
	c, _ = identity.TOTPCode(secret, clock.Now())
	if _, err := f.store.Login(f.Ctx, identity.LoginRequest{Username: "alice", Password: password, TOTP: c}); !errors.Is(err, identity.ErrLoginFailed) {
		t.Fatalf("a login after %d wrong re-authentications: %v, want the account locked", identity.LockoutFailures, err)
	}

	f.add("olga", identity.RoleOperator)
	lo, err := f.store.Login(f.Ctx, identity.LoginRequest{Username: "olga", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Reauth(f.Ctx, identity.ReauthRequest{SessionID: lo.Principal.SessionID, Password: password, TOTP: "123456"}); !errors.Is(err, identity.ErrReauthFailed) {
		t.Fatalf("a re-authentication without a second factor enrolled: %v", err)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'reauth' AND target::jsonb->>'reason' = 'mfa-not-enrolled'`); n != 1 {
		t.Fatalf("%d reauth rows for olga's refusal", n)
	}
}
