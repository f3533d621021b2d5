package console_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// Dual control with two browser sessions: olga asks for a replay-dead
// from /dead, sees on /approvals that it is hers and waits for someone
// else; otto, in a browser of his own, approves it there, and the dead
// letters are pending again, with an audit row naming otto and olga.
func TestApprovalFlowWithTwoSessions(t *testing.T) {
	h := newHarness(t, identity.PermReplayDead)
	h.user("olga", identity.RoleOperator)
	h.user("otto", identity.RoleOperator)
	h.user("vic", identity.RoleViewer)
	id := h.deadLetter("lab-a", "lab", "partner rejected")

	olga := h.tab()
	h.login(olga, "olga", "")
	h.open(olga, "/dead")
	h.do(olga, "ask", waitLoad(chromedp.Click(chromedp.CSS("button.replay-dead"))))
	h.do(olga, "request approval", waitLoad(chromedp.Click(chromedp.CSS(`main form button[type=submit]`))))
	h.open(olga, "/approvals")
	if n := get(h, olga, "buttons", chromedp.Evaluate[int](`document.querySelectorAll("button.approve, button.reject").length`)); n != 0 {
		t.Fatalf("olga's own request shows %d decision buttons to her", n)
	}
	if own := get(h, olga, "own", chromedp.Text(chromedp.CSS(".own"))); !strings.Contains(own, "another person who holds replay-dead must approve") {
		t.Fatalf("olga's own request says %q", own)
	}

	otto := h.tab()
	h.login(otto, "otto", "")
	h.open(otto, "/approvals")
	what := get(h, otto, "the request", chromedp.Text(chromedp.CSS("#approvals tbody tr")))
	if !strings.Contains(what, "replay the dead letters of destination lab") || !strings.Contains(what, "olga") {
		t.Fatalf("otto's /approvals shows %q", what)
	}
	h.shot(otto, "approvals")
	if s := h.outboundStatus(id); s != "dead" {
		t.Fatalf("the dead letter is %s before the approval", s)
	}
	h.do(otto, "approve", waitLoad(chromedp.Click(chromedp.CSS("button.approve"))))
	if notice := get(h, otto, "notice", chromedp.Text(chromedp.ID("notice"))); !strings.Contains(notice, "approved") || !strings.Contains(notice, "done") {
		t.Fatalf("after approving otto's page says %q", notice)
	}
	if s := h.outboundStatus(id); s != "pending" {
		t.Errorf("the dead letter is %s after otto approved, want pending", s)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'replay-dead' AND target::jsonb->>'actor' = 'otto'
		AND target::jsonb->>'requested_by' = 'olga'`); n < 1 {
		t.Errorf("no replay-dead audit row names otto as actor and olga as requester")
	}
	h.open(olga, "/approvals")
	if n := get(h, olga, "rows", chromedp.Evaluate[int](`document.querySelectorAll("#approvals tbody tr[data-approval]").length`)); n != 0 {
		t.Errorf("olga still sees %d pending requests", n)
	}

	// A viewer holds no permission that needs an approval: no link, and
	// the page is refused.
	viewer := h.tab()
	h.login(viewer, "vic", "")
	if n := get(h, viewer, "link", chromedp.Evaluate[int](`document.querySelectorAll('nav a[href="/approvals"]').length`)); n != 0 {
		t.Errorf("a viewer's navigation links to /approvals")
	}
	if resp := h.open(viewer, "/approvals"); resp.Status != 403 {
		t.Errorf("a viewer's /approvals answered %d, want 403", resp.Status)
	}
}
