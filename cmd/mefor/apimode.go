package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/apiclient"
)

// Exit code of a command whose action the API stored as a request for
// approval (access.approvals) instead of running it: nothing changed yet.
const exitAwaitingApproval = 6

// apiModeHelp is what the --help of each command that can go through the
// API says about it.
const apiModeHelp = `

Through the API: with MEFOR_API_URL (or --api) and MEFOR_API_TOKEN (or
--token), or after 'mefor login', this command goes through that node's API
as you: it needs neither DATABASE_URL nor MEFOR_ENCRYPTION_KEYS, prints the
same, and the API checks your permissions and channels and audits you.
Giving both a database and an API is refused.`

// apiActionHelp adds what an action through the API may answer.
const apiActionHelp = apiModeHelp + `
When the config's access.approvals names this action, the API stores it as
a request instead of running it: the command prints the request's id and
exits 6; another person approves it ('mefor approvals approve ID').`

// errBothModes is a command given a database and an API: which one it
// should use is not guessed, as the two check and audit differently (the
// database as a database role, the API as a person).
var errBothModes = errors.New("both a database (--database-url or DATABASE_URL) and an API (--api or MEFOR_API_URL) are given: " +
	"unset one (the API acts and is audited as you; the database as its role)")

// remote is the API client when the command goes through the API, nil
// when it goes to the database. A database URL alone means the database;
// an API URL alone, or a session kept by 'mefor login' when neither is
// given, means the API.
func (g *Globals) remote() (*apiclient.Client, error) {
	switch {
	case g.API != "" && g.DatabaseURL != "":
		return nil, &exitError{code: 2, err: errBothModes}
	case g.DatabaseURL != "":
		return nil, nil
	case g.API == "" && g.Token == "":
		if s, err := g.loadSession(); err != nil || s == nil {
			return nil, err
		}
	}
	return g.apiClient()
}

// apiGiven reports whether the command was given an API (flag, variable
// or a kept session), for the commands that need the database to say so.
func (g *Globals) apiGiven() bool {
	if g.API != "" || g.Token != "" {
		return true
	}
	s, _ := g.loadSession()
	return s != nil
}

// needsDatabase is the error of a command that works only on the
// database when it was given only an API.
func (g *Globals) needsDatabase() error {
	cmd := strings.Fields(g.command)
	name := "this command"
	if len(cmd) > 0 {
		name = "'mefor " + strings.Join(nonArgs(cmd), " ") + "'"
	}
	return &exitError{code: 1, err: fmt.Errorf("%s needs the database: it does not go through the API. "+
		"Give --database-url or DATABASE_URL (an API is given: --api, MEFOR_API_URL or a 'mefor login' session)", name)}
}

// databaseOnlyCommands are the commands that never go through the API:
// they run a node, change the schema, or manage people, tokens and keys,
// which the API does not offer. Given only an API they say so before
// anything else (other commands that need the database say so when they
// open it: Globals.pool).
var databaseOnlyCommands = []string{"run", "migrate", "user", "token create", "keys"}

func databaseOnly(command string) bool {
	c := strings.Join(nonArgs(strings.Fields(command)), " ")
	for _, d := range databaseOnlyCommands {
		if c == d || strings.HasPrefix(c, d+" ") {
			return true
		}
	}
	return false
}

// nonArgs drops kong's <arg> placeholders from a command line.
func nonArgs(words []string) []string {
	var out []string
	for _, w := range words {
		if !strings.HasPrefix(w, "<") {
			out = append(out, w)
		}
	}
	return out
}

// apiClient is the client of the API given by --api/--token (or their
// variables), else of the session 'mefor login' kept. A token given
// without a URL, or a URL other than the session's without a token, is an
// error naming what is missing.
func (g *Globals) apiClient() (*apiclient.Client, error) {
	o := apiclient.Options{URL: g.API, Token: g.Token, CAFile: g.APICA}
	if o.Token == "" {
		s, err := g.loadSession()
		if err != nil {
			return nil, err
		}
		if s != nil && (o.URL == "" || sameAPI(o.URL, s.API)) {
			o.URL, o.Token = s.API, s.Token
			if o.CAFile == "" {
				o.CAFile = s.APICA
			}
		}
	}
	if o.URL == "" && o.Token == "" {
		return nil, errors.New("no API: set MEFOR_API_URL and MEFOR_API_TOKEN (or --api and --token), or log in with 'mefor login --api URL'")
	}
	return apiclient.New(o)
}

func sameAPI(a, b string) bool { return strings.TrimRight(a, "/") == strings.TrimRight(b, "/") }

// session is what 'mefor login' keeps in the user's config directory: the
// API, the session's token and who it is. The file is the user's alone
// (mode 0600): the token acts as them until it expires or 'mefor logout'.
type session struct {
	API       string    `json:"api"`
	APICA     string    `json:"api_ca,omitempty"`
	Token     string    `json:"token"`
	User      string    `json:"user"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
	// ReauthAt is when 'mefor reauth' last proved the password
	// and second factor; the API honours it for 5 minutes.
	ReauthAt *time.Time `json:"reauth_at,omitempty"`
}

// sessionPath is mefor/session.json in the user's config directory:
// $XDG_CONFIG_HOME, else the system's (os.UserConfigDir: ~/.config on
// Linux).
func (g *Globals) sessionPath() (string, error) {
	dir, _ := g.env()("XDG_CONFIG_HOME")
	if dir == "" {
		d, err := os.UserConfigDir()
		if err != nil {
			return "", fmt.Errorf("no config directory for the session file: %w", err)
		}
		dir = d
	}
	return filepath.Join(dir, "mefor", "session.json"), nil
}

// loadSession reads the kept session, nil when there is none.
func (g *Globals) loadSession() (*session, error) {
	path, err := g.sessionPath()
	if err != nil {
		return nil, nil //nolint:nilerr // no config directory: no session
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the session file: %w", err)
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil || s.API == "" || s.Token == "" {
		return nil, fmt.Errorf("the session file %s is not one 'mefor login' wrote: remove it, or run 'mefor login' again", path)
	}
	return &s, nil
}

// saveSession writes s to the session file, mode 0600 in a directory of
// mode 0700, replacing it whole (a reader never sees half a file).
func (g *Globals) saveSession(s *session) (string, error) {
	path, err := g.sessionPath()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("create the session file's directory: %w", err)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".session-*")
	if err != nil {
		return "", fmt.Errorf("write the session file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write the session file: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write the session file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write the session file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("write the session file: %w", err)
	}
	return path, nil
}

// approvalAnswer is the API's 202: the action waits for a second person.
type approvalAnswer struct {
	ApprovalID int64           `json:"approval_id"`
	Action     string          `json:"action"`
	State      string          `json:"state"`
	ExpiresAt  time.Time       `json:"expires_at"`
	Approval   json.RawMessage `json:"approval"`
}

// act posts an action and decodes its 200 answer into out. A 202 (the
// action needs an approval) is printed, and returned as exit code 6.
func act(ctx context.Context, g *Globals, cl *apiclient.Client, path string, body, out any, asJSON bool) error {
	var raw json.RawMessage
	status, err := cl.Do(ctx, "POST", path, body, &raw)
	if err != nil {
		return explainAPI(err)
	}
	if status == http.StatusAccepted {
		var a approvalAnswer
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("the API's answer is not the JSON expected: %w", err)
		}
		if asJSON {
			if err := writeJSON(g.stdout, a); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(g.stdout, "approval %d requested: %s needs a second person; nothing was done yet. "+
				"Another person with the %s permission approves it with 'mefor approvals approve %d' before %s.\n",
				a.ApprovalID, a.Action, a.Action, a.ApprovalID, a.ExpiresAt.Local().Format(time.DateTime))
		}
		return &exitError{code: exitAwaitingApproval}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the API's answer is not the JSON expected: %w", err)
	}
	return nil
}

// explainAPI adds to an API refusal what to do about it, where the CLI
// knows: a stale re-authentication is renewed with 'mefor reauth'.
func explainAPI(err error) error {
	var e *apiclient.Error
	if errors.As(err, &e) && e.Status == http.StatusForbidden && e.Permission == "reauth" {
		return fmt.Errorf("%w\nrun 'mefor reauth' (a session from 'mefor login'; an API token cannot re-authenticate), then run this again", err)
	}
	return err
}
