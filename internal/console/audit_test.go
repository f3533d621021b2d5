package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// /audit lists the audit log and filters it by person, action and time:
// olga's replay-dead and body view are found by her name and by action,
// a time before them finds none, and a user with a channel scope or
// without audit.read gets 404.
func TestAuditFilteredByPersonActionAndTime(t *testing.T) {
	h := newHarness(t)
	secret := h.user("alice", identity.RoleAdmin)
	h.user("olga", identity.RoleOperator)
	labSecret := h.user("lab", identity.RoleAdmin, "lab-*")
	h.user("vic", identity.RoleViewer)
	h.deadLetter("lab-a", "lab", "partner rejected")
	before := time.Now().UTC().Add(-time.Minute).Format("2006-01-02T15:04")

	olga := h.tab()
	h.login(olga, "olga", "")
	h.open(olga, "/dead")
	h.do(olga, "replay", waitLoad(chromedp.Click(chromedp.CSS("button.replay-dead"))))
	h.do(olga, "confirm", waitLoad(chromedp.Click(chromedp.CSS(`main form button[type=submit]`))))

	ctx := h.tab()
	h.login(ctx, "alice", secret)
	rows := func() []string {
		return get(h, ctx, "rows", chromedp.Evaluate[[]string](
			`Array.from(document.querySelectorAll("#audit tbody tr[data-action]")).map(tr => tr.children[2].textContent.trim() + "|" + tr.dataset.action)`))
	}
	h.open(ctx, "/audit")
	all := rows()
	if len(all) < 2 || !strings.Contains(strings.Join(all, ","), "olga|replay-dead") || !strings.Contains(strings.Join(all, ","), "alice|") {
		t.Fatalf("the unfiltered log holds %v", all)
	}
	h.do(ctx, "filter by olga", chromedp.SetValue(chromedp.ID("f-actor"), "olga"), waitLoad(chromedp.Click(chromedp.ID("audit-search"))))
	mine := rows()
	if len(mine) == 0 || len(mine) >= len(all) {
		t.Fatalf("filtered by olga: %v (of %v)", mine, all)
	}
	for _, r := range mine {
		if !strings.HasPrefix(r, "olga|") {
			t.Errorf("filtered by olga, the page shows %s", r)
		}
	}
	h.shot(ctx, "audit")
	h.do(ctx, "filter by action", chromedp.SetValue(chromedp.ID("f-action"), "replay-dead"), waitLoad(chromedp.Click(chromedp.ID("audit-search"))))
	if got := rows(); len(got) != 1 || got[0] != "olga|replay-dead" {
		t.Fatalf("olga's replay-dead rows: %v", got)
	}
	if loc := get(h, ctx, "location", chromedp.Location()); !strings.Contains(loc, "actor=olga") || !strings.Contains(loc, "action=replay-dead") {
		t.Errorf("the filters are not in the URL (%s): the view cannot be shared", loc)
	}
	h.open(ctx, "/audit?actor=olga&until="+before)
	if got := rows(); len(got) != 0 {
		t.Errorf("until a minute before the test: %v", got)
	}
	h.open(ctx, "/audit?actor=olga&since="+before)
	if got := rows(); len(got) != len(mine) {
		t.Errorf("since a minute before the test: %v, want %v", got, mine)
	}

	for _, who := range []struct{ name, secret string }{{"lab", labSecret}, {"vic", ""}} {
		tab := h.tab()
		h.login(tab, who.name, who.secret)
		if n := get(h, tab, "link", chromedp.Evaluate[int](`document.querySelectorAll('nav a[href="/audit"]').length`)); n != 0 {
			t.Errorf("%s's navigation links to /audit", who.name)
		}
		if resp := h.open(tab, "/audit"); resp.Status != http.StatusNotFound {
			t.Errorf("%s's /audit answered %d, want 404", who.name, resp.Status)
		}
	}
}
