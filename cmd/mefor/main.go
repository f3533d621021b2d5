// Command mefor is the HL7 v2 integration engine's single binary: it runs a
// node and is the operator's tool for everything else.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// CLI is the whole command tree. Each command is thin: it parses flags and
// calls into ops (or a supporting package) to do the work.
type CLI struct {
	Globals

	Run        runCmd        `cmd:"" help:"Start a node: stage workers, inbound listeners and the reclaim job for a config."`
	Migrate    migrateCmd    `cmd:"" help:"Apply (or list with --status) River's and mefor's database migrations."`
	Config     configCmd     `cmd:"" help:"Validate a channel config file."`
	Handler    handlerCmd    `cmd:"" help:"Try a handler on sample messages without the database (handler test)."`
	Enqueue    enqueueCmd    `cmd:"" help:"Store a message into a channel as a listener would, and print its id."`
	Messages   messagesCmd   `cmd:"" help:"List messages, or show one with its stage rows and event timeline."`
	Dead       deadCmd       `cmd:"" help:"List dead-lettered deliveries."`
	Replay     replayCmd     `cmd:"" help:"Re-queue a message's dead or pending rows, or re-send its delivered ones."`
	ReplayDead replayDeadCmd `cmd:"" name:"replay-dead" help:"Re-queue every dead-lettered delivery matching a filter."`
	Cancel     cancelCmd     `cmd:"" help:"Cancel pending deliveries to a destination."`
	Status     statusCmd     `cmd:"" help:"Show per-channel and per-destination counts, backlog and oldest queued age."`
	Nodes      nodesCmd      `cmd:"" help:"List the cluster's nodes: last heartbeat, status, listener lease holder, River leader."`
	Stepdown   stepdownCmd   `cmd:"" help:"Planned failover: have the listener lease holder release it and stay on as a standby."`
	Reload     reloadCmd     `cmd:"" help:"Validate a config file, then have every node reload its copy of it; wait until they all did."`
	Send       sendCmd       `cmd:"" help:"Send HL7 messages from files to an MLLP listener and print each ACK code."`
	Sink       sinkCmd       `cmd:"" help:"Run an MLLP receiver that answers AA and writes each message to a file."`

	Maintenance maintenanceCmd `cmd:"" help:"List the scheduled maintenance jobs (reclaim, retention, reference syncs) or run one now."`
	Reference   referenceCmd   `cmd:"" help:"List reference sets (code-mapping tables), show one's rows, or sync one from its source now."`
	Audit       auditCmd       `cmd:"" help:"List audited operator actions, verify the audit log's hash chain, or print its anchor."`
	Keys        keysCmd        `cmd:"" help:"Encryption at rest: values under each key (keys status), re-encrypt under the active key (keys rotate)."`
	Alerts      alertsCmd      `cmd:"" help:"List mefor's own alert rules: state, since when, last notification."`
	User        userCmd        `cmd:"" help:"mefor's people: add, list, change, disable, enable or delete users; reset their MFA; list or end their sessions."`
	Token       tokenCmd       `cmd:"" help:"API tokens for scripts and the CLI: create one for a user (shown once), list them, revoke one."`
	Approvals   approvalsCmd   `cmd:"" help:"Dual control, through the API: list requests for approval, approve or reject one."`
	Login       loginCmd       `cmd:"" help:"Log in to a node's API with password and TOTP; keep the session for the commands that go through the API."`
	Reauth      reauthCmd      `cmd:"" help:"Prove password and TOTP again on your API session (stepdown needs it within 5 minutes)."`
	Logout      logoutCmd      `cmd:"" help:"End the session 'mefor login' kept, on the API and here."`

	Version kong.VersionFlag `help:"Print the version and exit."`
}

// Globals are the flags every command accepts.
type Globals struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL connection URL (default from DATABASE_URL), e.g. postgres://mefor:secret@localhost:5432/mefor."`
	LogLevel    string `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"Log level: debug, info, warn, error."`
	LogFormat   string `name:"log-format" enum:"text,json" default:"text" help:"Log format: text or json."`
	// See checkDatabaseTLS.
	AllowInsecureDatabase bool `name:"allow-insecure-database" help:"Connect to a database on another host without verified TLS (sslmode disable, allow or prefer); refused by default."`

	// The API a command goes through instead of the database (apimode.go).
	API   string `name:"api" env:"MEFOR_API_URL" placeholder:"URL" help:"Go through this node's API, https://host:port, instead of the database (default from MEFOR_API_URL, else the session of 'mefor login')."`
	Token string `name:"token" env:"MEFOR_API_TOKEN" placeholder:"TOKEN" help:"Your API token or session token for --api (default from MEFOR_API_TOKEN, which keeps it out of the process list, else the session of 'mefor login')."`
	APICA string `name:"api-ca" env:"MEFOR_API_CA" placeholder:"FILE" help:"PEM file of the CA that signed the API's certificate (default from MEFOR_API_CA; the system's roots without it)."`

	logger *slog.Logger
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// lookupEnv reads the environment (os.LookupEnv unless a test sets it).
	lookupEnv func(string) (string, bool)
	// command is the command line's command, e.g. "user add <name>".
	command string
}

// exitError carries a specific exit code up to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return runEnv(args, stdout, stderr, os.LookupEnv)
}

// runEnv is run reading the variables only mefor itself reads (such as
// MEFOR_ENCRYPTION_KEYS) through lookupEnv, so tests can give each
// in-process run its own.
func runEnv(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	return runIO(args, os.Stdin, stdout, stderr, lookupEnv)
}

// runIO is runEnv reading standard input from stdin (a password given
// with --password-stdin, in tests).
func runIO(args []string, stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("mefor"),
		kong.Description("mefor is a clustered HL7 v2 integration engine: MLLP and file intake stored in PostgreSQL before the ACK, "+
			"route → transform → deliver in strict per-lane order, retries, dead letters and replay, run entirely from this CLI."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, Summary: true}),
		kong.Vars{"version": version},
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(kongExit(code)) }),
	)
	if err != nil {
		fmt.Fprintf(stderr, "mefor: %v\n", err)
		return 2
	}

	kctx, code, done := parseArgs(parser, args)
	if done {
		return code
	}

	cli.Globals.stdin, cli.Globals.stdout, cli.Globals.stderr, cli.Globals.lookupEnv = stdin, stdout, stderr, lookupEnv
	cli.Globals.logger = newLogger(stderr, cli.LogLevel, cli.LogFormat)
	cli.Globals.command = kctx.Command()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	kctx.BindTo(ctx, (*context.Context)(nil))
	if databaseOnly(cli.Globals.command) && cli.DatabaseURL == "" && cli.Globals.apiGiven() {
		err = cli.Globals.needsDatabase()
	} else {
		err = kctx.Run(&cli.Globals)
	}
	if err == nil {
		return 0
	}
	err = explainDenied(kctx, &cli.Globals, err)
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "mefor: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "mefor: %v\n", err)
	return 1
}

// kongExit is how kong's exit (after --help, --version or a usage error)
// unwinds to parseArgs instead of ending the process.
type kongExit int

// parseArgs runs kong's parser, turning its help/version/usage exits into a
// return value so tests can drive the CLI in-process.
func parseArgs(parser *kong.Kong, args []string) (kctx *kong.Context, code int, done bool) {
	defer func() {
		if r := recover(); r != nil {
			c, ok := r.(kongExit)
			if !ok {
				panic(r)
			}
			kctx, code, done = nil, int(c), true
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		parser.Errorf("%s", err)
		if kctx != nil {
			_ = kctx.PrintUsage(true)
		}
		return nil, 2, true
	}
	return kctx, 0, false
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
