package console_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// node runs the cluster parts of a node on the test's database: its
// heartbeat, the listener lease at priority and the control loop that
// answers stepdown requests. It holds the lease once this returns, when
// it is the first.
func (h *harness) node(id string, priority int) *leader.Lease {
	h.T.Helper()
	const hb = 200 * time.Millisecond
	m, err := leader.NewMembership(leader.MembershipConfig{Pool: h.DB.Pool, NodeID: id, Heartbeat: hb, NodeTimeout: 10 * hb,
		ListenerPriority: priority, Logger: fixtures.Logger(h.T)})
	if err != nil {
		h.T.Fatal(err)
	}
	if err := m.Join(h.Ctx); err != nil {
		h.T.Fatal(err)
	}
	l, err := leader.NewLease(leader.LeaseConfig{Pool: h.DB.Pool, NodeID: id, Heartbeat: hb, FenceTimeout: 3 * hb, TTL: 5 * hb,
		Priority: priority, Membership: m, Logger: fixtures.Logger(h.T)})
	if err != nil {
		h.T.Fatal(err)
	}
	l.Tick(h.Ctx)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ctl := &leader.Control{Pool: h.DB.Pool, NodeID: id, Lease: l, Heartbeat: hb, Logger: fixtures.Logger(h.T)}
	for _, run := range []func(context.Context){m.Run, l.Run, ctl.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx) }()
	}
	h.T.Cleanup(func() { cancel(); wg.Wait() })
	return l
}

// A stepdown from /nodes goes through the re-authentication dialog: a
// wrong code is refused there and nothing happens; the right password and
// code re-authenticate the session (POST /api/v1/reauth) and the stepdown
// (POST /api/v1/cluster/stepdown) makes the real lease holder release the
// lease to the standby of the higher priority.
func TestStepdownWithReauthentication(t *testing.T) {
	h := newHarness(t)
	secret := h.user("alice", identity.RoleAdmin)
	h.user("olga", identity.RoleOperator)
	first := h.node("node-a", 1)
	second := h.node("node-b", 2)
	if !first.Serving() || second.Serving() {
		t.Fatalf("node-a serving %v, node-b %v; want node-a to hold the lease", first.Serving(), second.Serving())
	}

	ctx := h.tab()
	h.login(ctx, "alice", secret)
	h.open(ctx, "/nodes")
	rows := get(h, ctx, "rows", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#nodes tbody tr")).map(tr => tr.dataset.node + "|" + tr.children[5].textContent.trim() + "|" + tr.children[6].textContent.trim())`))
	if strings.Join(rows, ",") != "node-a|1|listener lease,node-b|2|" && strings.Join(rows, ",") != "node-b|2|,node-a|1|listener lease" {
		t.Fatalf("the nodes read %v", rows)
	}
	h.shot(ctx, "nodes")

	h.do(ctx, "step down", waitLoad(chromedp.Click(chromedp.ID("stepdown"))))
	h.shot(ctx, "nodes-reauth")
	wrong, _ := identity.TOTPCode(secret, time.Now().Add(-time.Hour))
	h.do(ctx, "a wrong code", chromedp.SetValue(chromedp.ID("reauth-password"), password), chromedp.SetValue(chromedp.ID("reauth-totp"), wrong),
		waitLoad(chromedp.Click(chromedp.ID("confirm-stepdown"))))
	if e := get(h, ctx, "error", chromedp.Text(chromedp.ID("reauth-error"))); e == "" {
		t.Fatal("a wrong code gave no error in the dialog")
	}
	if !first.Serving() {
		t.Fatal("node-a stepped down after a failed re-authentication")
	}

	// The next step's code: the login spent this step's, and each code
	// works once.
	code, _ := identity.TOTPCode(secret, time.Now().Add(30*time.Second))
	h.do(ctx, "the right code", chromedp.SetValue(chromedp.ID("reauth-password"), password), chromedp.SetValue(chromedp.ID("reauth-totp"), code),
		waitLoad(chromedp.Click(chromedp.ID("confirm-stepdown"))))
	if main := get(h, ctx, "the page", chromedp.Text(chromedp.CSS("main"))); !strings.Contains(main, "Stepdown of node-a: "+leader.OutcomeReleased) {
		t.Fatalf("after the stepdown the page says %q", main)
	}
	fixtures.Eventually(t, 10*time.Second, "node-b takes the lease", func() bool { return second.Serving() && !first.Serving() })
	if n := h.Int(`SELECT count(*) FROM mefor_audit WHERE action = 'reauth' AND target::jsonb->>'actor' = 'alice'`); n != 2 {
		t.Errorf("%d reauth audit rows naming alice, want the failed one and the good one", n)
	}

	// An operator (no stepdown permission) sees the nodes, not the button.
	op := h.tab()
	h.login(op, "olga", "")
	if resp := h.open(op, "/nodes"); resp.Status != http.StatusOK {
		t.Fatalf("an operator's /nodes answered %d", resp.Status)
	}
	if n := get(h, op, "buttons", chromedp.Evaluate[int](`document.querySelectorAll("#stepdown").length`)); n != 0 {
		t.Fatalf("an operator's /nodes shows the stepdown button")
	}
}
