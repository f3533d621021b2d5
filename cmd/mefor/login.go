package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/mefor/mefor/internal/apiclient"
)

// credentials are how login and reauth read a password and a second
// factor: from standard input with --password-stdin (a password is never
// an argument), else asked on the terminal without echo.
type credentials struct {
	PasswordStdin bool `name:"password-stdin" help:"Read the password from standard input's first line and the TOTP code (or a recovery code) from its second; asked on the terminal without it."`
}

// read returns the password and the TOTP code (empty when none is given).
func (c credentials) read(g *Globals, needTOTP bool) (password, totp string, err error) {
	if c.PasswordStdin {
		b, err := io.ReadAll(io.LimitReader(g.stdin, maxPasswordInput+1))
		if err != nil {
			return "", "", fmt.Errorf("read standard input: %w", err)
		}
		if len(b) > maxPasswordInput {
			return "", "", fmt.Errorf("standard input holds more than %d bytes: give the password and the TOTP code, one a line", maxPasswordInput)
		}
		lines := strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n")
		password = lines[0]
		if len(lines) > 1 {
			totp = strings.TrimSpace(lines[1])
		}
		if password == "" {
			return "", "", errors.New("standard input's first line (the password) is empty")
		}
		return password, totp, nil
	}
	f, ok := g.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return "", "", errors.New("not on a terminal: give the password (and TOTP code on the next line) on standard input with --password-stdin")
	}
	fmt.Fprint(g.stderr, "password: ")
	pw, err := term.ReadPassword(int(f.Fd()))
	fmt.Fprintln(g.stderr)
	if err != nil {
		return "", "", fmt.Errorf("read the password: %w", err)
	}
	prompt := "TOTP code (empty if you have none): "
	if needTOTP {
		prompt = "TOTP code (or a recovery code): "
	}
	fmt.Fprint(g.stderr, prompt)
	code, err := term.ReadPassword(int(f.Fd()))
	fmt.Fprintln(g.stderr)
	if err != nil {
		return "", "", fmt.Errorf("read the TOTP code: %w", err)
	}
	return string(pw), strings.TrimSpace(string(code)), nil
}

type loginCmd struct {
	credentials
	User string `arg:"" optional:"" placeholder:"USER" help:"Your mefor user name (asked on the terminal when not given)."`
	JSON bool   `name:"json" help:"Print who is logged in, and until when, as JSON (never the token)."`
}

func (c *loginCmd) Help() string {
	return `Logs in to a node's API (--api or MEFOR_API_URL, and --api-ca for an internal
CA) with your password and TOTP code, and keeps the session's token in your
config directory ($XDG_CONFIG_HOME/mefor/session.json, ~/.config on Linux),
readable only by you (mode 0600). The commands that go through the API
(status, nodes, messages, dead list, replay, replay-dead, cancel, stepdown,
audit list, alerts list, approvals) then use it when no MEFOR_API_TOKEN is
given, until the session expires or 'mefor logout'. A login also counts as a
re-authentication for 5 minutes (see 'mefor reauth').

Examples:
  mefor login alice --api https://mefor-a.example.org:8443
  printf '%s\n%s\n' "$PASSWORD" "$CODE" | mefor login alice --api https://mefor-a.example.org:8443 --password-stdin`
}

func (c *loginCmd) Run(ctx context.Context, g *Globals) error {
	url, ca := g.API, g.APICA
	if url == "" {
		if s, _ := g.loadSession(); s != nil {
			url = s.API
			if ca == "" {
				ca = s.APICA
			}
		}
	}
	if url == "" {
		return errors.New("no API: give --api https://host:port (or MEFOR_API_URL)")
	}
	if ca != "" {
		abs, err := filepath.Abs(ca)
		if err != nil {
			return err
		}
		ca = abs
	}
	user := c.User
	if user == "" {
		f, ok := g.stdin.(*os.File)
		if c.PasswordStdin || !ok || !term.IsTerminal(int(f.Fd())) {
			return errors.New("name your user: mefor login USER")
		}
		fmt.Fprint(g.stderr, "user: ")
		line, err := bufio.NewReader(f).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read the user name: %w", err)
		}
		user = strings.TrimSpace(line)
	}
	pw, totp, err := c.read(g, false)
	if err != nil {
		return err
	}
	s, err := apiclient.Login(ctx, apiclient.Options{URL: url, CAFile: ca}, apiclient.LoginRequest{Username: user, Password: pw, TOTP: totp})
	if err != nil {
		return err
	}
	path, err := g.saveSession(&session{API: url, APICA: ca, Token: s.Token, User: s.User, Role: s.Role, ExpiresAt: s.ExpiresAt})
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, map[string]any{"api": url, "user": s.User, "role": s.Role, "expires_at": s.ExpiresAt, "session_file": path})
	}
	fmt.Fprintf(g.stdout, "logged in to %s as %s (role %s) until %s; session kept in %s\n",
		url, s.User, s.Role, s.ExpiresAt.Local().Format(time.DateTime), path)
	return nil
}

type reauthCmd struct {
	credentials
}

func (c *reauthCmd) Help() string {
	return `Proves your password and TOTP code again on the session 'mefor login' kept
(or the session token given as MEFOR_API_TOKEN): stepdown through the API
needs a re-authentication within the last 5 minutes. An API token (mefor
token create) has no session and cannot re-authenticate.

Examples:
  mefor reauth && mefor stepdown
  printf '%s\n%s\n' "$PASSWORD" "$CODE" | mefor reauth --password-stdin`
}

func (c *reauthCmd) Run(ctx context.Context, g *Globals) error {
	cl, err := g.apiClient()
	if err != nil {
		return err
	}
	pw, totp, err := c.read(g, true)
	if err != nil {
		return err
	}
	var out struct {
		ValidFor string `json:"valid_for"`
	}
	if _, err := cl.Do(ctx, http.MethodPost, "/api/v1/reauth", map[string]string{"password": pw, "totp": totp}, &out); err != nil {
		var e *apiclient.Error
		if errors.As(err, &e) && e.Field == "Authorization" {
			return fmt.Errorf("%w (log in with 'mefor login' and re-authenticate that session)", err)
		}
		return err
	}
	if s, _ := g.loadSession(); s != nil && (g.Token == "" || g.Token == s.Token) {
		now := time.Now()
		s.ReauthAt = &now
		if _, err := g.saveSession(s); err != nil {
			return err
		}
	}
	fmt.Fprintf(g.stdout, "re-authenticated: actions that need it (stepdown) are allowed for %s\n", out.ValidFor)
	return nil
}

type logoutCmd struct{}

func (c *logoutCmd) Help() string {
	return `Ends the session 'mefor login' kept, on the API (the token stops working at
once) and here (the session file is removed). When the API cannot be reached
the file is kept, so that 'mefor logout' can be run again.

Examples:
  mefor logout`
}

func (c *logoutCmd) Run(ctx context.Context, g *Globals) error {
	s, err := g.loadSession()
	if err != nil {
		return err
	}
	if s == nil {
		fmt.Fprintln(g.stdout, "not logged in (no session file)")
		return nil
	}
	path, err := g.sessionPath()
	if err != nil {
		return err
	}
	cl, err := apiclient.New(apiclient.Options{URL: s.API, Token: s.Token, CAFile: s.APICA})
	if err != nil {
		return err
	}
	_, err = cl.Do(ctx, http.MethodPost, "/api/v1/logout", nil, nil)
	ended := "ended on " + s.API
	switch {
	case apiclient.StatusOf(err) == http.StatusUnauthorized:
		ended = "it had already ended (expired or ended by an administrator)"
	case err != nil:
		return fmt.Errorf("the session could not be ended on %s, so %s is kept (run 'mefor logout' again): %w", s.API, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the session file: %w", err)
	}
	fmt.Fprintf(g.stdout, "logged out %s: session %s; %s removed\n", s.User, ended, path)
	return nil
}
