package console_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// /dead groups dead letters by destination and error; replaying a group
// there (a confirmation page, then the API's replay-dead) makes its
// deliveries pending again and leaves the other destinations dead.
func TestReplayDeadFromDeadPage(t *testing.T) {
	h := newHarness(t)
	h.user("olga", identity.RoleOperator)
	lab1 := h.deadLetter("lab-a", "lab", "partner rejected")
	lab2 := h.deadLetter("lab-a", "lab", "partner rejected")
	lab3 := h.deadLetter("lab-b", "lab", "connection refused")
	billing := h.deadLetter("adt", "billing", "partner rejected")
	ctx := h.tab()
	h.login(ctx, "olga", "")

	h.open(ctx, "/dead")
	groups := get(h, ctx, "groups", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#dead tbody tr")).map(tr => Array.from(tr.children).slice(0, 4).map(c => c.textContent.trim()).join("|"))`))
	want := []string{"lab|lab-a|partner rejected|2", "billing|adt|partner rejected|1", "lab|lab-b|connection refused|1"}
	if strings.Join(groups, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the groups are\n%s\nwant\n%s", strings.Join(groups, "\n"), strings.Join(want, "\n"))
	}
	h.shot(ctx, "dead")

	h.do(ctx, "replay lab", waitLoad(chromedp.Click(chromedp.CSS(`tr[data-destination="lab"] button.replay-dead`))))
	confirm := get(h, ctx, "the confirmation", chromedp.Text(chromedp.CSS("main")))
	if !strings.Contains(confirm, "The 3 dead letters of destination lab") || !strings.Contains(confirm, `2 with "partner rejected"`) {
		t.Fatalf("the confirmation does not say what a replay of lab touches: %s", confirm)
	}
	if lab1s := h.outboundStatus(lab1); lab1s != "dead" {
		t.Fatalf("the confirmation page replayed already: %s", lab1s)
	}
	h.do(ctx, "confirm", waitLoad(chromedp.Click(chromedp.CSS(`main form button[type=submit]`))))
	if notice := get(h, ctx, "notice", chromedp.Text(chromedp.ID("notice"))); !strings.Contains(notice, "3 dead letters are queued again") {
		t.Fatalf("after the replay the page says %q", notice)
	}
	for _, id := range []int64{lab1, lab2, lab3} {
		if s := h.outboundStatus(id); s != "pending" {
			t.Errorf("message %d's delivery to lab is %s after the replay, want pending", id, s)
		}
	}
	if s := h.outboundStatus(billing); s != "dead" {
		t.Errorf("billing's dead letter is %s after replaying lab's", s)
	}
	if rows := get(h, ctx, "rows", chromedp.Evaluate[int](`document.querySelectorAll("#dead tbody tr[data-destination]").length`)); rows != 1 {
		t.Errorf("the page lists %d groups after the replay, want billing's only", rows)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'replay-dead' AND target::jsonb->>'actor' = 'olga'`); n < 1 {
		t.Errorf("no replay-dead audit row names olga")
	}
}

// When access.approvals names replay-dead, /dead's button asks for
// approval, the confirmation says another person holding replay-dead must
// approve, and nothing is replayed.
func TestReplayDeadAsksForApproval(t *testing.T) {
	h := newHarness(t, identity.PermReplayDead)
	h.user("olga", identity.RoleOperator)
	id := h.deadLetter("lab-a", "lab", "partner rejected")
	ctx := h.tab()
	h.login(ctx, "olga", "")
	h.open(ctx, "/dead")
	if b := get(h, ctx, "button", chromedp.Text(chromedp.CSS("button.replay-dead"))); b != "Request approval…" {
		t.Fatalf("the group's button reads %q", b)
	}
	h.do(ctx, "ask", waitLoad(chromedp.Click(chromedp.CSS("button.replay-dead"))))
	if s := get(h, ctx, "approval", chromedp.Text(chromedp.ID("needs-approval"))); !strings.Contains(s, "another person who holds replay-dead must approve") {
		t.Fatalf("the confirmation says %q", s)
	}
	h.do(ctx, "request approval", waitLoad(chromedp.Click(chromedp.CSS(`main form button[type=submit]`))))
	if notice := get(h, ctx, "notice", chromedp.Text(chromedp.ID("notice"))); !strings.Contains(notice, "Approval requested") {
		t.Fatalf("after asking the page says %q", notice)
	}
	if s := h.outboundStatus(id); s != "dead" {
		t.Errorf("the dead letter is %s before anyone approved", s)
	}
	if n := h.Int(`SELECT count(*) FROM mefor_approval WHERE state = 'pending' AND requested_by = 'olga'`); n != 1 {
		t.Errorf("%d pending requests by olga, want 1", n)
	}
}

// A viewer sees the dead letters but no replay button; a lab-scoped
// operator sees only lab channels' dead letters.
func TestDeadPageButtonsAndScope(t *testing.T) {
	h := newHarness(t)
	h.user("vic", identity.RoleViewer)
	h.user("lab", identity.RoleOperator, "lab-*")
	h.deadLetter("lab-a", "lab", "partner rejected")
	h.deadLetter("adt", "billing", "partner rejected")

	viewer := h.tab()
	h.login(viewer, "vic", "")
	h.open(viewer, "/dead")
	if n := get(h, viewer, "buttons", chromedp.Evaluate[int](`document.querySelectorAll("button.replay-dead").length`)); n != 0 {
		t.Fatalf("a viewer's /dead shows %d replay buttons", n)
	}
	if n := get(h, viewer, "rows", chromedp.Evaluate[int](`document.querySelectorAll("#dead tbody tr[data-destination]").length`)); n != 2 {
		t.Fatalf("a viewer's /dead shows %d groups, want 2", n)
	}

	scoped := h.tab()
	h.login(scoped, "lab", "")
	h.open(scoped, "/dead")
	dests := get(h, scoped, "rows", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#dead tbody tr[data-destination]")).map(tr => tr.dataset.destination)`))
	if len(dests) != 1 || dests[0] != "lab" {
		t.Fatalf("a lab user's /dead shows %v, want [lab]", dests)
	}
}
