package console_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// Opening a message shows its metadata and timeline but not its body;
// asking for the body (a POSTed form) shows it segment by segment, each
// field with its position, and writes a view-body audit row naming the
// person.
func TestViewingABodyIsAudited(t *testing.T) {
	h := newHarness(t)
	h.user("olga", identity.RoleOperator)
	id, ctl := h.receive("adt", "PAT-5120")
	ctx := h.tab()
	h.login(ctx, "olga", "")
	path := "/messages/" + strconv.FormatInt(id, 10)

	h.open(ctx, path)
	main := get(h, ctx, "the page", chromedp.Text(chromedp.CSS("main")))
	if !strings.Contains(main, ctl) || !strings.Contains(main, "received") {
		t.Fatalf("the message page lacks its control id or timeline: %s", main)
	}
	if strings.Contains(main, "PAT-5120") {
		t.Fatal("the body shows before it was asked for")
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'view-body'`); n != 0 {
		t.Fatalf("%d view-body rows before the body was asked for", n)
	}
	h.shot(ctx, "message")

	h.do(ctx, "show the body", waitLoad(chromedp.Click(chromedp.ID("show-body"))))
	pos := get(h, ctx, "PID-3", chromedp.Evaluate[string](
		`(Array.from(document.querySelectorAll(".fld")).find(f => f.title === "PID-3") || {}).textContent || ""`))
	if pos != "PAT-5120^^^HOSP" {
		t.Fatalf("field PID-3 reads %q", pos)
	}
	if loc := get(h, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, path) {
		t.Fatalf("the body page is at %s", loc)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'view-body' AND outcome = 'ok' AND target::jsonb->>'actor' = 'olga'`); n != 1 {
		t.Errorf("%d view-body rows naming olga, want 1", n)
	}
	h.shot(ctx, "message-body")
}

// A viewer sees no button they may not use: no body, no replay, no
// patient search; an operator sees them.
func TestViewerSeesNoActionButtons(t *testing.T) {
	h := newHarness(t)
	h.user("vic", identity.RoleViewer)
	h.user("olga", identity.RoleOperator)
	id, _ := h.receive("adt", "PAT-1")
	path := "/messages/" + strconv.FormatInt(id, 10)
	count := `document.querySelectorAll("#show-body, #replay, #f-patient").length`

	viewer := h.tab()
	h.login(viewer, "vic", "")
	h.open(viewer, path)
	if n := get(h, viewer, "buttons", chromedp.Evaluate[int](count)); n != 0 {
		t.Fatalf("a viewer's message page shows %d action buttons", n)
	}
	h.open(viewer, "/messages")
	if n := get(h, viewer, "buttons", chromedp.Evaluate[int](count)); n != 0 {
		t.Fatalf("a viewer's search page shows the patient search")
	}

	operator := h.tab()
	h.login(operator, "olga", "")
	h.open(operator, path)
	if n := get(h, operator, "buttons", chromedp.Evaluate[int](count)); n != 2 {
		t.Fatalf("an operator's message page shows %d of the body and replay buttons", n)
	}
}

// A user scoped to lab-* gets 404 for an ADT message's page, as for one
// that does not exist, and sees their lab message.
func TestLabScopedUserGets404ForAnADTMessage(t *testing.T) {
	h := newHarness(t)
	h.user("lab", identity.RoleOperator, "lab-*")
	adt, _ := h.receive("adt", "PAT-2")
	lab, _ := h.receive("lab-chem", "PAT-3")
	ctx := h.tab()
	h.login(ctx, "lab", "")

	if resp := h.open(ctx, "/messages/"+strconv.FormatInt(adt, 10)); resp.Status != http.StatusNotFound {
		t.Fatalf("an adt message's page answered %d to a lab user", resp.Status)
	}
	if main := get(h, ctx, "the page", chromedp.Text(chromedp.CSS("main"))); strings.Contains(main, "adt") {
		t.Fatalf("the 404 page names the channel: %s", main)
	}
	if resp := h.open(ctx, "/messages/"+strconv.FormatInt(adt+1000, 10)); resp.Status != http.StatusNotFound {
		t.Fatalf("a missing message's page answered %d", resp.Status)
	}
	if resp := h.open(ctx, "/messages/"+strconv.FormatInt(lab, 10)); resp.Status != http.StatusOK {
		t.Fatalf("the lab message's page answered %d", resp.Status)
	}
}

// Every page carries the security headers: a CSP allowing no inline
// script, no framing, no referrer, and no-store on pages with content.
func TestSecurityHeaders(t *testing.T) {
	h := newHarness(t)
	h.user("olga", identity.RoleOperator)
	id, _ := h.receive("adt", "PAT-4")
	ctx := h.tab()
	h.open(ctx, "/login")
	h.login(ctx, "olga", "")
	for _, path := range []string{"/login", "/", "/messages", "/messages/" + strconv.FormatInt(id, 10), "/dead", "/nodes", "/approvals", "/audit", "/no-such-page"} {
		resp := h.open(ctx, path)
		header := func(name string) string {
			for k, v := range resp.Headers {
				if strings.EqualFold(k, name) {
					s, _ := v.(string)
					return s
				}
			}
			return ""
		}
		csp := header("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
		if v := header("X-Frame-Options"); v != "DENY" {
			t.Errorf("%s: X-Frame-Options %q", path, v)
		}
		if v := header("Referrer-Policy"); v != "no-referrer" {
			t.Errorf("%s: Referrer-Policy %q", path, v)
		}
		if v := header("Cache-Control"); v != "no-store" {
			t.Errorf("%s: Cache-Control %q", path, v)
		}
	}
	// The policy is enforced: an inline script a page somehow held would
	// not run.
	ran := get(h, ctx, "inline script", chromedp.Evaluate[bool](`(() => { const s = document.createElement("script");
		s.textContent = "window.inlineRan = true"; document.body.appendChild(s); return window.inlineRan === true; })()`))
	if ran {
		t.Error("an inline script ran despite the Content-Security-Policy")
	}
}
