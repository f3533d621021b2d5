package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// An admin signs in through /login with password and TOTP: a wrong code
// keeps them on the login page with the API's refusal, the right one
// opens the dashboard (the session cookie reaches the console's pages),
// and logging out ends the session, so / sends them back to /login.
func TestLoginWithTOTP(t *testing.T) {
	h := newHarness(t)
	secret := h.user("alice", identity.RoleAdmin)
	ctx := h.tab()

	h.open(ctx, "/login")
	h.shot(ctx, "login")
	h.submitLogin(ctx, "alice", "000000")
	if title := get(h, ctx, "title", chromedp.Title()); !strings.HasPrefix(title, "Sign in") {
		t.Fatalf("a wrong TOTP code led to %q", title)
	}
	if msg := get(h, ctx, "error", chromedp.Text(chromedp.CSS(".error"))); !strings.Contains(msg, "login failed") {
		t.Fatalf("the refusal reads %q", msg)
	}

	code, _ := identity.TOTPCode(secret, time.Now())
	h.submitLogin(ctx, "alice", code)
	if title := get(h, ctx, "title", chromedp.Title()); !strings.HasPrefix(title, "Dashboard") {
		msg, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		t.Fatalf("after a correct login the page is %q: %s", title, msg)
	}
	if who := get(h, ctx, "who", chromedp.Text(chromedp.CSS(".who"))); !strings.Contains(who, "alice") || !strings.Contains(who, "admin") {
		t.Fatalf("the header names %q", who)
	}

	h.do(ctx, "log out", waitLoad(chromedp.Click(chromedp.CSS(".who button"))))
	h.open(ctx, "/")
	if title := get(h, ctx, "title", chromedp.Title()); !strings.HasPrefix(title, "Sign in") {
		t.Fatalf("after logging out / shows %q", title)
	}
}
