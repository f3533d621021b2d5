package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// The dashboard's counts follow the messages as they arrive, without the
// page reloading: console.js polls GET /api/v1/status and updates the
// rows, adding one for a channel that appears.
func TestDashboardCountsChangeAsMessagesArrive(t *testing.T) {
	h := newHarness(t)
	h.user("olga", identity.RoleOperator)
	h.receive("adt", "P100")
	ctx := h.tab()
	h.login(ctx, "olga", "")

	received := `tr[data-channel="adt"] [data-k="received"]`
	if n := get(h, ctx, "adt received", chromedp.Text(chromedp.CSS(received))); n != "1" {
		t.Fatalf("adt received reads %q, want 1", n)
	}
	// A mark on the page's window: a reload would lose it.
	h.do(ctx, "mark the page", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[any]("window.stillHere = true")(ctx, t)
		return err
	}))
	h.receive("adt", "P101")
	h.receive("adt", "P102")
	h.receive("lab", "P103")

	poll := chromedp.Poll[bool](`(() => { const a = document.querySelector('tr[data-channel="adt"] [data-k="received"]');
		const l = document.querySelector('tr[data-channel="lab"] [data-k="received"]');
		return a && a.textContent === "3" && l && l.textContent === "1"; })()`, chromedp.WithPollingTimeout(20*time.Second))
	if _, err := chromedp.Run(ctx, poll); err != nil {
		adt, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#channels")))
		t.Fatalf("the dashboard did not show 3 adt and 1 lab messages: %v; it shows %q", err, adt)
	}
	if still := get(h, ctx, "the mark", chromedp.Evaluate[bool]("window.stillHere === true")); !still {
		t.Fatal("the page reloaded to show the new counts")
	}
	h.shot(ctx, "dashboard")
}
