package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pquerna/otp"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

const apiTestPassword = "correct horse battery"

// apiNode is a node's HTTPS API over an opsFixture's database, with its
// CA file, and a TOTP clock the test moves.
type apiNode struct {
	url, ca string
	store   *identity.Store
	mu      sync.Mutex
	now     time.Time
}

func (n *apiNode) clock() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.now
}

func (n *apiNode) advance(d time.Duration) {
	n.mu.Lock()
	n.now = n.now.Add(d)
	n.mu.Unlock()
}

func startAPINode(t *testing.T, f *opsFixture, keys *crypt.Keyring) *apiNode {
	return startAPINodeWith(t, f, keys, nil)
}

// startAPINodeWith is startAPINode whose actions of approve need a second
// person (access.approvals.required_for).
func startAPINodeWith(t *testing.T, f *opsFixture, keys *crypt.Keyring, approve []identity.Permission) *apiNode {
	t.Helper()
	ctx := context.Background()
	n := &apiNode{now: time.Now()}
	n.store = identity.New(f.db.Pool, identity.Options{Argon2: identity.Argon2Params{Time: 1, MemoryKiB: 1024, Threads: 1}, Now: n.clock})
	ca := certtest.NewCA(t, "mefor test CA")
	dir := t.TempDir()
	cert, key := ca.Issue(t, "localhost", certtest.Options{}).WriteFiles(t, dir, "api")
	srv, err := api.New(api.Config{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key,
		Reads: ops.APIReads{Pool: f.db.Pool, Keys: keys}, Actions: ops.APIActions{Pool: f.db.Pool},
		Approvals: api.Approvals{Store: approval.New(f.db.Pool, approval.Options{}), RequiredFor: approve}},
		n.store, fixtures.Logger(t), nil)
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
	n.url = "https://localhost:" + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:")
	n.ca = ca.WriteFile(t, dir, "ca.pem")
	return n
}

// user adds a user and returns an API token of theirs and their TOTP
// secret ("" without one).
func (n *apiNode) user(t *testing.T, name, role string, channels ...string) (token, secret string) {
	t.Helper()
	ctx := context.Background()
	_, enr, err := n.store.AddUser(ctx, identity.NewUser{Name: name, Role: role, Channels: channels, Password: apiTestPassword})
	if err != nil {
		t.Fatal(err)
	}
	if enr != nil {
		k, err := otp.NewKeyFromURL(enr.TOTPURI)
		if err != nil {
			t.Fatal(err)
		}
		secret = k.Secret()
	}
	_, token, err = n.store.CreateToken(ctx, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return token, secret
}

// env is the environment of an in-process run: no encryption keys, and
// a config directory of the test's own (for the session file).
func apiEnv(configDir string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		switch name {
		case crypt.EnvKeys:
			return "", false
		case "XDG_CONFIG_HOME":
			return configDir, true
		}
		return os.LookupEnv(name)
	}
}

// runCLI runs mefor in-process with stdin and the environment of apiEnv.
func runCLI(configDir, stdin string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := runIO(args, strings.NewReader(stdin), &out, &errb, apiEnv(configDir))
	return code, out.String(), errb.String()
}

// ages and clock times change between two runs a moment apart.
var (
	ageRe  = regexp.MustCompile(`\b\d+(d|h|m|s)(\d+(h|m|s))?\b`)
	timeRe = regexp.MustCompile(`\d\d:\d\d:\d\d(\.\d+)?`)
	secsRe = regexp.MustCompile(`(_seconds": )[\d.]+`)
)

func normalize(s string) string {
	s = secsRe.ReplaceAllString(s, "${1}SECONDS")
	return timeRe.ReplaceAllString(ageRe.ReplaceAllString(s, "AGE"), "TIME")
}

// Each read command prints the same through the API, with no database URL
// and no encryption keys, as on the database, for one store: tables,
// JSON, a message shown by id and by control id, with its bodies, and the
// audit log.
func TestReadCommandsThroughTheAPIPrintTheSame(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	n := startAPINode(t, f, nil)
	root, _ := n.user(t, "root", identity.RoleAdmin)
	cfg := t.TempDir()
	statusEncryption := regexp.MustCompile(`(?m)^(encryption at rest|note): .*\n`)

	for _, args := range [][]string{
		{"audit", "list"},
		{"audit", "list", "--json"},
		{"status"},
		{"status", "--json"},
		{"nodes"},
		{"alerts", "list"},
		{"messages", "list"},
		{"messages", "list", "--json"},
		{"messages", "list", "--status", "error", "--channel", "adt"},
		{"messages", "list", "--limit", "2"},
		{"messages", "show", strconv.FormatInt(f.dead, 10)},
		{"messages", "show", "CTRL1"},
		{"messages", "show", strconv.FormatInt(f.done, 10), "--body"},
		{"messages", "show", strconv.FormatInt(f.done, 10), "--body", "--json"},
		{"messages", "show", "NO-SUCH"},
		{"dead", "list"},
		{"dead", "list", "--json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			dbCode, dbOut, dbErr := runCLI(cfg, "", append(args, "--database-url", f.db.URL)...)
			code, out, errs := runCLI(cfg, "", append(args, "--api", n.url, "--token", root, "--api-ca", n.ca)...)
			if args[0] == "status" {
				dbOut, out = statusEncryption.ReplaceAllString(dbOut, ""), statusEncryption.ReplaceAllString(out, "")
			}
			if code != dbCode || normalize(out) != normalize(dbOut) || normalize(errs) != normalize(dbErr) {
				t.Fatalf("through the API: exit %d\n%s%s\non the database: exit %d\n%s%s", code, out, errs, dbCode, dbOut, dbErr)
			}
			if strings.Contains(args[0], "messages") && !strings.Contains(out, "CTRL") && args[2] != "NO-SUCH" {
				t.Fatalf("nothing listed:\n%s", out)
			}
		})
	}
}

// Actions through the API answer as on the database: two stores built the
// same way get the same commands, one through the API as a person, the
// other on its database.
func TestActionsThroughTheAPIPrintTheSame(t *testing.T) {
	t.Parallel()
	fdb, fapi := newOpsFixture(t), newOpsFixture(t)
	if fdb.dead != fapi.dead || fdb.done != fapi.done {
		t.Fatalf("the twin stores differ: %+v %+v", fdb, fapi)
	}
	n := startAPINode(t, fapi, nil)
	op, _ := n.user(t, "olga", identity.RoleOperator)
	cfg := t.TempDir()
	for _, args := range [][]string{
		{"replay-dead", "--destination", "lab", "--yes"},
		{"replay", strconv.FormatInt(fdb.done, 10)},
		{"replay", strconv.FormatInt(fdb.done, 10), "--json"},
		{"replay", "999999"},
		{"cancel", "--destination", "lab", "--top"},
		{"cancel", "--destination", "lab"},
		{"cancel", "--destination", "lab", "--json"},
	} {
		dbCode, dbOut, dbErr := runCLI(cfg, "", append(args, "--database-url", fdb.db.URL)...)
		code, out, errs := runCLI(cfg, "", append(args, "--api", n.url, "--token", op, "--api-ca", n.ca)...)
		if code != dbCode || out != dbOut || errs != dbErr {
			t.Fatalf("%v through the API: exit %d\n%s%s\non the database: exit %d\n%s%s", args, code, out, errs, dbCode, dbOut, dbErr)
		}
	}
	if got := fixtures.Count(t, fapi.db.Pool, `SELECT count(*) FROM mefor_audit WHERE action = 'replay-dead' AND target::jsonb->>'actor' = 'olga'`); got != 1 {
		t.Fatalf("%d replay-dead rows naming olga", got)
	}
}

// A user who sees only lab-* channels lists only their messages through
// the CLI, and another channel's message is not found (exit 1), as one
// that does not exist. A patient search goes in a POST body and finds
// what the database finds.
func TestScopedUserThroughTheCLI(t *testing.T) {
	t.Parallel()
	sf := newSearchFixture(t)
	kr, err := crypt.Parse(sf.keys)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var labMsg int64
	err = pgx.BeginFunc(ctx, sf.db.Pool, func(tx pgx.Tx) error {
		labMsg, err = pipeline.Receive(ctx, tx, sf.q, pipeline.Inbound{Channel: "lab-a", Source: "test",
			Raw: []byte("MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ORU^R01|LAB1|P|2.5\r"), ControlID: "LAB1", MessageType: "ORU", TriggerEvent: "R01"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	n := startAPINode(t, sf.opsFixture, kr)
	lab, _ := n.user(t, "lena", identity.RoleOperator, "lab-*")
	all, _ := n.user(t, "olga", identity.RoleOperator)
	cfg := t.TempDir()
	as := func(token string, args ...string) (int, string, string) {
		return runCLI(cfg, "", append(args, "--api", n.url, "--token", token, "--api-ca", n.ca)...)
	}

	code, out, errs := as(lab, "messages", "list")
	if code != 0 || !strings.Contains(out, "LAB1") || strings.Contains(out, "adt") {
		t.Fatalf("lena's messages list: exit %d\n%s%s", code, out, errs)
	}
	adt := strconv.FormatInt(sf.ids["OLD1"], 10)
	code, out, errs = as(lab, "messages", "show", adt)
	if code == 0 || !strings.Contains(errs, "not found") || strings.Contains(out, "adt") {
		t.Fatalf("lena's messages show of an adt message: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := as(lab, "messages", "show", strconv.FormatInt(labMsg, 10)); code != 0 || !strings.Contains(out, "lab-a") {
		t.Fatalf("lena's messages show of her message: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := as(lab, "audit", "list"); code == 0 || !strings.Contains(errs, "audit.read") {
		t.Fatalf("lena's audit list: exit %d\n%s", code, errs)
	}

	// By patient: the same messages as on the database (with the keys),
	// through the API without them.
	var dbOut, dbErr bytes.Buffer
	dbCode := runIO([]string{"messages", "list", "--patient", "P100", "--database-url", sf.db.URL}, strings.NewReader(""), &dbOut, &dbErr, envWith(sf.keys))
	code, out, errs = as(all, "messages", "list", "--patient", "P100")
	if dbCode != 0 || code != 0 || out != dbOut.String() || !strings.Contains(out, "OLD1") || strings.Contains(out, "A08X") {
		t.Fatalf("messages list --patient through the API: exit %d\n%s%s\non the database: exit %d\n%s%s", code, out, errs, dbCode, dbOut.String(), dbErr.String())
	}
	if got := fixtures.Count(t, sf.db.Pool, `SELECT count(*) FROM mefor_audit WHERE action = 'search-patient' AND target::jsonb->>'actor' = 'olga'`); got != 1 {
		t.Fatalf("%d search-patient rows naming olga", got)
	}
}

// mefor login keeps the session in a 0600 file that the API commands use
// with no token given; stepdown asks for 'mefor reauth' first and works
// after it, printing what the database mode prints; logout removes the
// file and ends the session on the server.
func TestLoginReauthLogout(t *testing.T) {
	t.Parallel()
	f := emptyOpsFixture(t)
	n := startAPINode(t, f, nil)
	_, secret := n.user(t, "root", identity.RoleAdmin)
	cfg := t.TempDir()
	code := func() string {
		c, err := identity.TOTPCode(secret, n.clock())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	c, out, errs := runCLI(cfg, apiTestPassword+"\n"+code()+"\n", "login", "root", "--api", n.url, "--api-ca", n.ca, "--password-stdin")
	if c != 0 || !strings.Contains(out, "logged in to "+n.url+" as root") {
		t.Fatalf("login: exit %d\n%s%s", c, out, errs)
	}
	path := filepath.Join(cfg, "mefor", "session.json")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("session file: %v %v", fi, err)
	}
	var token string
	if err := f.db.Pool.QueryRow(context.Background(), `SELECT count(*)::text FROM mefor_session WHERE revoked_at IS NULL`).Scan(&token); err != nil || token != "1" {
		t.Fatalf("%s live sessions after login (%v)", token, err)
	}
	s, err := (&Globals{lookupEnv: apiEnv(cfg)}).loadSession()
	if err != nil || s == nil || strings.Contains(out+errs, s.Token) {
		t.Fatalf("the session file: %v %v, or its token printed", s, err)
	}

	// No --api, no --token: the session.
	if c, out, errs := runCLI(cfg, "", "nodes"); c != 0 || !strings.Contains(out, "no node has joined yet") {
		t.Fatalf("nodes with the session: exit %d\n%s%s", c, out, errs)
	}
	if c, out, errs := runCLI(cfg, "", "stepdown"); c != 1 || !strings.Contains(errs, "mefor reauth") {
		t.Fatalf("stepdown before reauth: exit %d\n%s%s", c, out, errs)
	}
	n.advance(30 * time.Second) // the login's code is used up
	if c, out, errs := runCLI(cfg, apiTestPassword+"\n"+code()+"\n", "reauth", "--password-stdin"); c != 0 || !strings.Contains(out, "re-authenticated") {
		t.Fatalf("reauth: exit %d\n%s%s", c, out, errs)
	}
	c, out, errs = runCLI(cfg, "", "stepdown")
	dbC, dbOut, dbErrs := runCLI(cfg, "", "stepdown", "--database-url", f.db.URL)
	if c != exitStepdownRefused || c != dbC || out != dbOut || errs != dbErrs {
		t.Fatalf("stepdown after reauth: exit %d\n%s%s\non the database: exit %d\n%s%s", c, out, errs, dbC, dbOut, dbErrs)
	}

	if c, out, errs := runCLI(cfg, "", "logout"); c != 0 || !strings.Contains(out, "logged out root") {
		t.Fatalf("logout: exit %d\n%s%s", c, out, errs)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the session file is still there: %v", err)
	}
	if c, _, errs := runCLI(cfg, "", "nodes", "--api", n.url, "--api-ca", n.ca, "--token", s.Token); c == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("the logged-out session's token still works: exit %d\n%s", c, errs)
	}
}

// The commands that need the database say so when given only an API, and
// a command given both a database and an API refuses to guess.
func TestDatabaseOnlyCommandsGivenAnAPI(t *testing.T) {
	t.Parallel()
	cfg := t.TempDir()
	file := filepath.Join(cfg, "mefor.yaml")
	if err := os.WriteFile(file, []byte("channels: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"run", "--config", file},
		{"migrate"},
		{"user", "list"},
		{"token", "create", "--user", "root"},
		{"keys", "status"},
	} {
		c, out, errs := runCLI(cfg, "", append(args, "--api", "https://mefor.example.org:8443", "--token", "mefor_t_x")...)
		if c == 0 || !strings.Contains(errs, "'mefor "+args[0]) || !strings.Contains(errs, "needs the database") {
			t.Fatalf("%v given only an API: exit %d\n%s%s", args, c, out, errs)
		}
	}
	c, out, errs := runCLI(cfg, "", "status", "--api", "https://mefor.example.org:8443", "--token", "mefor_t_x",
		"--database-url", "postgres://mefor@localhost/mefor")
	if c != 2 || !strings.Contains(errs, "both a database") {
		t.Fatalf("status given both: exit %d\n%s%s", c, out, errs)
	}
}

// An action that needs a second person is not run: the CLI prints the
// request's id and exits 6, and nothing changed until it is approved.
func TestActionAwaitingApprovalExitsSix(t *testing.T) {
	t.Parallel()
	f := newOpsFixture(t)
	n := startAPINodeWith(t, f, nil, []identity.Permission{identity.PermReplayDead})
	op, _ := n.user(t, "olga", identity.RoleOperator)
	cfg := t.TempDir()
	c, out, errs := runCLI(cfg, "", "replay-dead", "--destination", "lab", "--yes", "--api", n.url, "--token", op, "--api-ca", n.ca)
	if c != exitAwaitingApproval || !strings.Contains(out, "approval 1 requested") || !strings.Contains(out, "mefor approvals approve 1") {
		t.Fatalf("replay-dead needing an approval: exit %d\n%s%s", c, out, errs)
	}
	c, out, errs = runCLI(cfg, "", "replay-dead", "--destination", "lab", "--yes", "--json", "--api", n.url, "--token", op, "--api-ca", n.ca)
	if a := decode[approvalAnswer](t, out); c != exitAwaitingApproval || a.ApprovalID != 2 || a.State != "pending" {
		t.Fatalf("replay-dead --json needing an approval: exit %d\n%s%s", c, out, errs)
	}
	if got := fixtures.Count(t, f.db.Pool, `SELECT count(*) FROM mefor_work WHERE status = 'dead'`); got != 1 {
		t.Fatalf("%d dead rows after the requests, want the one still dead", got)
	}
}
