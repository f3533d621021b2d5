package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/mefor/mefor/workers"
)

// hookReceiver is a real HTTP server standing in for a chat or paging
// webhook; it answers 500 to the first failFirst POSTs.
type hookReceiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	failFirst int
	posts     []hookPost
}

type hookPost struct {
	status int
	auth   string
	n      workers.Notification
}

func newHookReceiver(t *testing.T, failFirst int) *hookReceiver {
	h := &hookReceiver{failFirst: failFirst}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var n workers.Notification
		if err := json.Unmarshal(body, &n); err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook got %s %s %q: %v", r.Method, r.Header.Get("Content-Type"), body, err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		status := http.StatusOK
		if len(h.posts) < h.failFirst {
			status = http.StatusInternalServerError
		}
		h.posts = append(h.posts, hookPost{status: status, auth: r.Header.Get("Authorization"), n: n})
		w.WriteHeader(status)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) list() []hookPost {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookPost(nil), h.posts...)
}

// count is how many POSTs were answered status for state.
func (h *hookReceiver) count(state string, status int) int {
	n := 0
	for _, p := range h.list() {
		if p.n.State == state && p.status == status {
			n++
		}
	}
	return n
}

// stuckLabConfig is an alerts test's config: channel adt routes
// everything to destination lab, whose partner rejects it all, and alerts
// are evaluated every second. sinks is the rest of the file, from inside
// the sinks block: the test's sink "hook" and the rest; getenv expands
// its variables. It returns the config, lab's partner and the channel's
// listen address.
func stuckLabConfig(t *testing.T, sinks string, getenv func(string) (string, bool)) (*config.Config, *partner, string) {
	t.Helper()
	lab := newPartner(t, "", rejectAll)
	listen := fixtures.FreeAddr(t)
	y := fixtures.ADTChannel(listen) + `
      - destinations: [lab]
destinations:
` + stuckLab(lab.addr) + `alerts:
  interval: 1s
  sinks:
    hook:` + sinks
	cfg, err := config.Parse("alerts.yaml", []byte(y), getenv)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, lab, listen
}

// An alert rule on a stuck destination fires once for the whole cluster
// (two nodes, extra evaluations by hand), its webhook is retried after the
// receiver answered 500, the log sink writes it, and it resolves once the
// destination drains.
func TestAlertFiresOnceAcrossNodesAndResolves(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	hook := newHookReceiver(t, 1)
	cfg, lab, listen := stuckLabConfig(t, fmt.Sprintf(`
      webhook: {url: "%s/mefor?token=URLSECRET", headers: {Authorization: "${HOOK_TOKEN}"}}
    journal:
      log: {level: warn}
  rules:
    - name: lab-backlog
      destination: lab
      queue_depth: 3
      oldest_queued: 1h
      sinks: [hook, journal]
`, hook.srv.URL), func(k string) (string, bool) {
		return "Bearer HEADERSECRET", k == "HOOK_TOKEN"
	})
	var logs fixtures.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	opts := func(id string) func(*engine.Options) {
		return func(o *engine.Options) {
			o.NodeID, o.Logger, o.AlertRetryBase = id, logger, 100*time.Millisecond
		}
	}
	cluster.StartNode(t, db, cfg, opts("node-a"))
	cluster.StartNode(t, db, cfg, opts("node-b"))

	send(t, listen, adt("A000", "P1"), adt("A001", "P2"))
	// Two queued: below the threshold of three.
	time.Sleep(2500 * time.Millisecond)
	if posts := hook.list(); len(posts) != 0 {
		t.Fatalf("notified below the threshold: %+v", posts)
	}
	send(t, listen, adt("A002", "P3"))

	fixtures.Eventually(t, 30*time.Second, "firing delivered after a 500", func() bool {
		return hook.count("firing", http.StatusOK) == 1
	})
	// Evaluate again and again, as a second leader or an operator would:
	// the recorded state keeps them from firing twice.
	ins := fixtures.Inserter(t, db)
	deps := &workers.Deps{Pool: db.Pool, Logger: logger}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if changes, err := workers.EvaluateAlerts(context.Background(), deps, cfg.Alerts, ins); err != nil || len(changes) != 0 {
				t.Errorf("extra evaluation: %d changes, %v; want none", len(changes), err)
			}
		})
	}
	wg.Wait()
	time.Sleep(2 * time.Second)

	posts := hook.list()
	if len(posts) != 2 || posts[0].status != http.StatusInternalServerError || posts[1].status != http.StatusOK {
		t.Fatalf("webhook POSTs = %+v, want one firing answered 500, then its retry answered 200", posts)
	}
	first, retry := posts[0].n, posts[1].n
	if first.Since != retry.Since || first.State != "firing" || retry.State != "firing" {
		t.Fatalf("the retry is not the same notification: %+v vs %+v", first, retry)
	}
	if n := retry; n.Rule != "lab-backlog" || n.Destination != "lab" || n.Condition != "queue_depth" || n.Value != 3 ||
		n.Threshold != 3 || n.Unit != "rows" || len(n.Breaches) != 1 || !strings.Contains(n.Summary, "3 rows queued") {
		t.Fatalf("firing notification = %+v", n)
	}
	if posts[1].auth != "Bearer HEADERSECRET" {
		t.Fatalf("webhook Authorization = %q, want the configured header", posts[1].auth)
	}
	a := alertRow(t, db, "lab-backlog")
	if a.State != alert.AlertFiring || a.Transitions != 1 || a.LastNotifyError != "" || a.LastNotifiedAt == nil {
		t.Fatalf("alert row while firing = %+v", a)
	}

	lab.setAnswer(nil) // the partner recovers
	fixtures.Eventually(t, 30*time.Second, "resolved delivered", func() bool {
		return hook.count("resolved", http.StatusOK) == 1
	})
	time.Sleep(2500 * time.Millisecond) // more evaluations: nothing more to say
	posts = hook.list()
	if len(posts) != 3 {
		t.Fatalf("webhook POSTs = %+v, want firing (500), firing, resolved", posts)
	}
	if n := posts[2].n; n.Condition != "queue_depth" || n.Value != 0 || len(n.Breaches) != 0 || !n.Since.After(first.Since) {
		t.Fatalf("resolved notification = %+v", n)
	}
	a = alertRow(t, db, "lab-backlog")
	if a.State != alert.AlertOK || a.Transitions != 2 || a.LastNotification == "" {
		t.Fatalf("alert row after drain = %+v", a)
	}

	out := logs.String()
	for _, want := range []string{`msg="alert firing" rule=lab-backlog sink=journal state=firing condition=queue_depth value=3 threshold=3`,
		`msg="alert resolved" rule=lab-backlog sink=journal`, "answered 500 Internal Server Error"} {
		if !strings.Contains(out, want) {
			t.Errorf("node logs lack %q", want)
		}
	}
	if strings.Count(out, `msg="alert firing" rule=lab-backlog sink=journal`) != 1 {
		t.Errorf("the log sink wrote the firing alert %d times, want once", strings.Count(out, `msg="alert firing" rule=lab-backlog sink=journal`))
	}
	for _, secret := range []string{"HEADERSECRET", "URLSECRET"} {
		if strings.Contains(out, secret) || strings.Contains(a.LastNotifyError, secret) {
			t.Errorf("a log line or the alert row shows %s", secret)
		}
	}
}

func alertRow(t *testing.T, db *testcontainers.DB, rule string) alert.Alert {
	t.Helper()
	list, err := alert.ListAlerts(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(a alert.Alert) bool { return a.Rule == rule })
	if i < 0 {
		t.Fatalf("no alert row for %s in %+v", rule, list)
	}
	return list[i]
}

// A rule that resolves while its firing notification is still being
// retried sends resolved only after firing got through: the receiver sees
// the changes in order.
func TestAlertResolvedWaitsForFiring(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	hook := newHookReceiver(t, 3)
	cfg, lab, listen := stuckLabConfig(t, fmt.Sprintf(`
      webhook: {url: "%s"}
  rules:
    - name: lab-stuck
      destination: lab
      queue_depth: 1
      sinks: [hook]
`, hook.srv.URL), nil)
	cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.AlertRetryBase = 100 * time.Millisecond })
	send(t, listen, adt("R000", "P1"))
	fixtures.Eventually(t, 30*time.Second, "the first firing POST (answered 500)", func() bool { return len(hook.list()) >= 1 })
	lab.setAnswer(nil) // drains at once: the rule resolves while firing is retried
	fixtures.Eventually(t, 60*time.Second, "resolved delivered", func() bool { return hook.count("resolved", http.StatusOK) == 1 })

	var got []string
	for _, p := range hook.list() {
		got = append(got, fmt.Sprintf("%s:%d", p.n.State, p.status))
	}
	want := "firing:500 firing:500 firing:500 firing:200 resolved:200"
	if strings.Join(got, " ") != want {
		t.Fatalf("webhook saw %v, want %s", got, want)
	}
}
