package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/jackc/pgx/v5"
	"github.com/pquerna/otp"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/console"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

const password = "correct horse battery"

// harness is a real API server with the console mounted, on a database of
// the test's own, with the patient index keyed, served over HTTP on an
// address the shared headless Chromium reaches.
type harness struct {
	*fixtures.DBTest
	store   *identity.Store
	keys    *crypt.Keyring
	browser *testcontainers.Browser
	// origin is the server as the browser names it, http://host:port.
	origin string
	seq    atomic.Int64
}

// newHarness starts the server; approvalsFor, when given, are the
// permissions whose actions wait for a second person (access.approvals).
func newHarness(t *testing.T, approvalsFor ...identity.Permission) *harness {
	h := &harness{DBTest: fixtures.NewDBTest(t), keys: fixtures.Keyring(t, "k1"), browser: testcontainers.SharedBrowser(t)}
	h.store = identity.New(h.DB.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	cfg := api.Config{Listen: h.browser.ListenAddr(), Plaintext: true,
		Reads:   ops.APIReads{Pool: h.DB.Pool, Keys: h.keys},
		Actions: ops.APIActions{Pool: h.DB.Pool, CancelWait: time.Second, StepdownTimeout: 10 * time.Second},
		Console: func(a http.Handler) http.Handler {
			return console.New(a, console.Options{Logger: fixtures.Logger(t), Approvals: approvalsFor})
		}}
	if len(approvalsFor) > 0 {
		cfg.Approvals = api.Approvals{Store: approval.New(h.DB.Pool, approval.Options{}), RequiredFor: approvalsFor}
	}
	srv, err := api.New(cfg, h.store, fixtures.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	h.origin = h.browser.Origin(ln.Addr().String())
	return h
}

// receive stores an ADT message into channel as a listener would, with
// the patient identifier patient, and returns its id and control id.
func (h *harness) receive(channel, patient string) (int64, string) {
	h.T.Helper()
	q, err := ops.NewQueue(h.DB.Pool, nil)
	if err != nil {
		h.T.Fatal(err)
	}
	ctl := fmt.Sprintf("CTL%d%d", time.Now().UnixNano()%1e9, h.seq.Add(1))
	raw := "MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|" + ctl + "|P|2.5\rPID|1||" + patient + "^^^HOSP||DOE^JANE\r"
	var id int64
	err = pgx.BeginFunc(context.Background(), h.DB.Pool, func(tx pgx.Tx) error {
		id, err = pipeline.Receive(context.Background(), tx, q, pipeline.Inbound{Channel: channel, Source: "test", Raw: []byte(raw),
			ControlID: ctl, MessageType: "ADT", TriggerEvent: "A01", PatientID: patient, Keys: h.keys})
		return err
	})
	if err != nil {
		h.T.Fatal(err)
	}
	return id, ctl
}

// deadLetter receives a message into channel and hands it on, through
// the real hand-offs, to a delivery to destination that failed for good
// with lastError: a dead letter.
func (h *harness) deadLetter(channel, destination, lastError string) int64 {
	h.T.Helper()
	q, err := ops.NewQueue(h.DB.Pool, nil)
	if err != nil {
		h.T.Fatal(err)
	}
	id, _ := h.receive(channel, "PAT-"+channel)
	row := h.pending(jobs.IngressLane(channel), id)
	h.tx(func(tx pgx.Tx) error {
		return pipeline.RouteHandoff(h.Ctx, tx, q, row, []pipeline.RoutedOut{{Route: "r", Handler: "h"}})
	})
	row = h.pending(jobs.RoutedLane(channel), id)
	lane := "outbound:" + destination
	h.tx(func(tx pgx.Tx) error {
		return pipeline.TransformHandoff(h.Ctx, tx, q, row, []pipeline.OutboundOut{{Destination: destination, Lane: lane, Payload: []byte("MSH|out")}})
	})
	row = h.pending(lane, id)
	h.tx(func(tx pgx.Tx) error {
		return pipeline.Failed(h.Ctx, tx, row, pipeline.Attempt{Outcome: "AR", AckCode: "AR", Error: lastError}, 0, true)
	})
	return id
}

// pending is msg's pending row in lane.
func (h *harness) pending(lane string, msg int64) pipeline.Row {
	h.T.Helper()
	return fixtures.PendingRow(h.T, h.DB, lane, msg)
}

func (h *harness) tx(fn func(tx pgx.Tx) error) {
	h.T.Helper()
	if err := pgx.BeginFunc(h.Ctx, h.DB.Pool, fn); err != nil {
		h.T.Fatal(err)
	}
}

// outboundStatus is the status of msg's delivery.
func (h *harness) outboundStatus(msg int64) string {
	h.T.Helper()
	var s string
	if err := h.DB.Pool.QueryRow(h.Ctx, `SELECT status FROM mefor_work WHERE message_id = $1 AND stage = 'outbound'`, msg).Scan(&s); err != nil {
		h.T.Fatal(err)
	}
	return s
}

// user adds a person and returns their TOTP secret ("" for a role that
// needs none).
func (h *harness) user(name, role string, channels ...string) string {
	h.T.Helper()
	_, enr, err := h.store.AddUser(h.Ctx, identity.NewUser{Name: name, Role: role, Channels: channels, Password: password})
	if err != nil {
		h.T.Fatal(err)
	}
	if enr == nil {
		return ""
	}
	key, err := otp.NewKeyFromURL(enr.TOTPURI)
	if err != nil {
		h.T.Fatal(err)
	}
	return key.Secret()
}

// tab is a browser tab in a browser context of its own (its own cookies
// and history), closed when the test ends.
func (h *harness) tab() context.Context {
	h.T.Helper()
	alloc, cancelAlloc := remote.NewAllocator(context.Background(), "ws://"+h.browser.DevTools)
	ctx, cancelCtx := chromedp.NewContext(alloc, chromedp.WithNewBrowserContext())
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	h.T.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		h.T.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// do runs actions in ctx, failing the test with what.
func (h *harness) do(ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	h.T.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		h.T.Fatalf("%s: %v", what, err)
	}
}

// get runs a with a value in ctx, failing the test with what.
func get[T any](h *harness, ctx context.Context, what string, a chromedp.Action[T]) T {
	h.T.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		h.T.Fatalf("%s: %v", what, err)
	}
	return v
}

// open navigates to path and returns the response's status and headers.
func (h *harness) open(ctx context.Context, path string) *network.Response {
	h.T.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(h.origin+path))
	if err != nil {
		h.T.Fatalf("open %s: %v", path, err)
	}
	return resp
}

// login signs name in through /login's form, with a TOTP code when
// secret is set, and waits for the dashboard.
func (h *harness) login(ctx context.Context, name, secret string) {
	h.T.Helper()
	h.open(ctx, "/login")
	code := ""
	if secret != "" {
		code, _ = identity.TOTPCode(secret, time.Now())
	}
	h.submitLogin(ctx, name, code)
	if title := get(h, ctx, "read the title", chromedp.Title()); !strings.HasPrefix(title, "Dashboard") {
		msg, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		h.T.Fatalf("after logging in as %s the page is %q: %s", name, title, msg)
	}
}

// submitLogin fills /login's form and submits it, waiting for the page
// that answers.
func (h *harness) submitLogin(ctx context.Context, name, code string) {
	h.T.Helper()
	steps := []chromedp.Action[chromedp.Void]{chromedp.SetValue(chromedp.ID("username"), name),
		chromedp.SetValue(chromedp.ID("password"), password)}
	if code != "" {
		steps = append(steps, chromedp.SetValue(chromedp.ID("totp"), code))
	}
	h.do(ctx, "log in as "+name, append(steps, waitLoad(chromedp.Submit(chromedp.ID("password"))))...)
}

// waitLoad runs a, which makes the page navigate, and waits for the new
// page to load.
func waitLoad(a chromedp.Action[chromedp.Void]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.RunResponse(ctx, a)
		return chromedp.Void{}, err
	}
}

// shot saves the page as docs/console/NAME-1280.png and NAME-390.png when
// MEFOR_CONSOLE_SHOTS=1, and restores the wide viewport.
func (h *harness) shot(ctx context.Context, name string) {
	h.T.Helper()
	if os.Getenv("MEFOR_CONSOLE_SHOTS") != "1" {
		return
	}
	dir := filepath.Join("..", "..", "docs", "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.T.Fatal(err)
	}
	for _, size := range []struct {
		w, h int64
	}{{1280, 800}, {390, 844}} {
		h.do(ctx, "resize for "+name, chromedp.EmulateViewport(size.w, size.h), chromedp.Sleep(200*time.Millisecond))
		png := get(h, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.png", name, size.w)), png, 0o644); err != nil {
			h.T.Fatal(err)
		}
	}
	h.do(ctx, "restore the viewport", chromedp.EmulateViewport(1280, 800))
}
