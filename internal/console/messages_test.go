package console_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
)

// resultIDs are the message ids of the search page's result rows.
func resultIDs(h *harness, ctx context.Context) []string {
	h.T.Helper()
	return get(h, ctx, "result ids", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#results tbody th a")).map(a => a.textContent)`))
}

// history is every URL of the tab's history.
func history(h *harness, ctx context.Context) []string {
	h.T.Helper()
	res, err := chromedp.Call(ctx, page.GetNavigationHistory, cdp.Empty{})
	if err != nil {
		h.T.Fatalf("read the history: %v", err)
	}
	var urls []string
	for _, e := range res.Entries {
		urls = append(urls, e.URL, e.Title)
	}
	return urls
}

// A search by control id is a GET whose filters are in the URL; a search
// by patient is POSTed: it finds the patient's message, and the
// identifier is in no URL or title of the tab's history.
func TestSearchByControlIDAndByPatient(t *testing.T) {
	h := newHarness(t)
	h.user("olga", identity.RoleOperator)
	first, ctl := h.receive("adt", "PAT-7731")
	second, _ := h.receive("adt", "PAT-4410")
	ctx := h.tab()
	h.login(ctx, "olga", "")

	h.open(ctx, "/messages")
	if ids := resultIDs(h, ctx); len(ids) != 2 {
		t.Fatalf("the unfiltered list holds %v", ids)
	}
	h.do(ctx, "search by control id", chromedp.SetValue(chromedp.ID("f-control"), ctl),
		waitLoad(chromedp.Submit(chromedp.ID("f-control"))))
	if ids := resultIDs(h, ctx); len(ids) != 1 || ids[0] != strconv.FormatInt(first, 10) {
		t.Fatalf("control id %s found %v, want [%d]", ctl, ids, first)
	}
	if loc := get(h, ctx, "location", chromedp.Location()); !strings.Contains(loc, "control_id="+ctl) {
		t.Fatalf("a control id search is at %s, want its filter in the URL (it can be bookmarked)", loc)
	}
	h.shot(ctx, "messages")

	h.open(ctx, "/messages")
	h.do(ctx, "search by patient", chromedp.SetValue(chromedp.ID("f-patient"), "PAT-4410"),
		waitLoad(chromedp.Submit(chromedp.ID("f-patient"))))
	if ids := resultIDs(h, ctx); len(ids) != 1 || ids[0] != strconv.FormatInt(second, 10) {
		t.Fatalf("patient PAT-4410 found %v, want [%d]", ids, second)
	}
	for _, u := range append(history(h, ctx), get(h, ctx, "location", chromedp.Location()), get(h, ctx, "title", chromedp.Title())) {
		if strings.Contains(u, "PAT-4410") {
			t.Fatalf("the patient identifier is in the browser's history or title: %s", u)
		}
	}
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'search-patient' AND target::jsonb->>'actor' = 'olga'`); n != 1 {
		t.Errorf("%d patient-search audit rows naming olga, want 1", n)
	}
}
