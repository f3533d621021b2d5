package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/apiclient"
	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// `mefor approvals` goes through the API with a person's token, over
// HTTPS with the API's CA: the requester's approve is refused naming
// dual control, another person's runs the action, reject ends a request,
// and list shows who asked and who decided. No database URL is given.
func TestApprovalsCLIThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := emptyOpsFixture(t)
	ctx := context.Background()
	store := identity.New(f.db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}})
	token := func(name string) string {
		if _, _, err := store.AddUser(ctx, identity.NewUser{Name: name, Role: identity.RoleOperator, Password: "correct horse battery"}); err != nil {
			t.Fatal(err)
		}
		_, secret, err := store.CreateToken(ctx, name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	alice, bob := token("alice"), token("bob")

	ca := certtest.NewCA(t, "mefor test CA")
	dir := t.TempDir()
	cert, key := ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, dir, "api")
	srv, err := api.New(api.Config{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key,
		Reads: ops.APIReads{Pool: f.db.Pool}, Actions: ops.APIActions{Pool: f.db.Pool},
		Approvals: api.Approvals{Store: approval.New(f.db.Pool, approval.Options{}), RequiredFor: []identity.Permission{identity.PermReplayDead}}},
		store, fixtures.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()
	t.Cleanup(func() { stop(); <-done })
	apiURL := "https://localhost:" + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:")
	caFile := ca.WriteFile(t, dir, "ca.pem")

	// alice asks, through the same client the CLI uses.
	cl, err := apiclient.New(apiclient.Options{URL: apiURL, Token: alice, CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	var asked struct {
		ApprovalID int64 `json:"approval_id"`
	}
	for range 2 {
		if status, err := cl.Do(ctx, "POST", "/api/v1/dead/replay", map[string]string{"destination": "lab"}, &asked); err != nil || status != 202 {
			t.Fatalf("replay-dead by alice: %d %v", status, err)
		}
	}
	first, second := asked.ApprovalID-1, asked.ApprovalID

	mefor := func(token string, args ...string) (int, string, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := runIO(append(args, "--api", apiURL, "--token", token, "--api-ca", caFile), strings.NewReader(""), &out, &errb, envWith(""))
		return code, out.String(), errb.String()
	}
	if code, out, errs := mefor(alice, "approvals", "approve", fmt.Sprint(first)); code == 0 || !strings.Contains(errs, "dual-control") {
		t.Fatalf("alice approving her own request: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs := mefor(bob, "approvals", "approve", fmt.Sprint(first), "--json")
	if code != 0 {
		t.Fatalf("bob's approve: exit %d\n%s%s", code, out, errs)
	}
	type decided struct {
		Approval approvalView   `json:"approval"`
		Result   map[string]any `json:"result"`
	}
	if d := decode[decided](t, out); d.Approval.State != "done" || d.Approval.DecidedBy == nil || *d.Approval.DecidedBy != "bob" || d.Result == nil {
		t.Fatalf("bob's approve --json: %s", out)
	}
	if code, out, errs := mefor(bob, "approvals", "reject", fmt.Sprint(second)); code != 0 || !strings.Contains(out, "rejected") {
		t.Fatalf("bob's reject: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := mefor(bob, "approvals", "approve", fmt.Sprint(second)); code == 0 || !strings.Contains(errs, "409") {
		t.Fatalf("approving a rejected request: exit %d\n%s", code, errs)
	}
	code, out, errs = mefor(alice, "approvals", "list", "--json")
	list := decode[[]approvalView](t, out)
	if code != 0 || len(list) != 2 || list[0].State != "rejected" || list[1].State != "done" || list[1].RequestedBy != "alice" {
		t.Fatalf("approvals list: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := mefor("mefor_t_not-a-token", "approvals", "list"); code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("a wrong token: exit %d\n%s", code, errs)
	}
	if n := fixtures.Count(t, f.db.Pool, `SELECT count(*) FROM mefor_audit WHERE action = 'approval-approve' AND outcome = 'ok'
		AND target::jsonb->>'actor' = 'bob' AND target::jsonb->>'requested_by' = 'alice'`); n != 1 {
		t.Fatalf("%d approval rows naming bob and alice", n)
	}
}
