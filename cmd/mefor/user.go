package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/ops"
)

type userCmd struct {
	Add      userAddCmd      `cmd:"" help:"Add a user with a role and channel scope; the password is read from standard input."`
	List     userListCmd     `cmd:"" help:"List users: role, channels, MFA, disabled or locked."`
	Set      userSetCmd      `cmd:"" help:"Change a user's role or channels; their sessions end."`
	Disable  userDisableCmd  `cmd:"" help:"Disable a user: no login, their sessions end, their tokens are refused."`
	Enable   userEnableCmd   `cmd:"" help:"Enable a disabled user again (also clears a lockout)."`
	Delete   userDeleteCmd   `cmd:"" help:"Delete a user with their sessions and tokens."`
	ResetMFA userResetMFACmd `cmd:"" name:"reset-mfa" help:"Give a user a new TOTP secret and new recovery codes; the old ones stop working."`
	Sessions userSessionsCmd `cmd:"" help:"List a user's sessions, or end them all with --revoke."`
}

func (c *userCmd) Help() string {
	return `mefor's own users, the people who log in to the API (docs/access.md). These
commands run with the database URL of a member of mefor_admin: this is how an
administrator bootstraps the first admin. Every change is recorded in the audit
log; passwords, TOTP secrets and recovery codes never are.

Roles: viewer (status, nodes, message metadata and timelines, dead letters,
alerts; no content), operator (viewer, plus bodies, replay, replay-dead,
cancel, enqueue), admin (everything; always with TOTP MFA), and the custom
roles of the config's access.roles (give --config FILE with --role).

Examples:
  printf '%s\n' "$PASSWORD" | mefor user add alice --role admin --password-stdin --json
  mefor user add lab-analyst --role viewer --channel 'lab-*' --password-stdin < pw.txt
  mefor user add lab-lead --role lab-lead --config /etc/mefor/mefor.yaml --password-stdin < pw.txt
  mefor user list
  mefor user set lab-analyst --channel 'lab-*' --channel 'micro-*'
  mefor user disable lab-analyst`
}

type userAddCmd struct {
	Name          string   `arg:"" help:"User name: 1 to 64 lowercase letters, digits, '.', '_', '@' or '-'."`
	Role          string   `name:"role" required:"" help:"Role: viewer, operator, admin, or a custom role of --config's access.roles."`
	Config        string   `name:"config" type:"existingfile" placeholder:"FILE" help:"Config file whose access.roles defines the custom role given to --role."`
	Channel       []string `name:"channel" placeholder:"PATTERN" help:"A channel pattern the user is limited to (lab-*); repeat for more. Defaults to every channel."`
	PasswordStdin bool     `name:"password-stdin" help:"Read the password from standard input (its first line). Required: a password is never taken as an argument."`
	JSON          bool     `name:"json" help:"Print JSON, with totp_uri and recovery_codes for a role that requires MFA."`
}

func (c *userAddCmd) Help() string {
	return `Adds a user. The password (at least 12 characters, not the user name) is
read from standard input, never from an argument, and stored as an argon2id
hash. For a role that requires MFA (admin always does) a TOTP second factor is
enrolled: the otpauth:// URI (load it into an authenticator app, or make a QR
code of it) and ten single-use recovery codes are printed this once.

Examples:
  printf '%s\n' "$PASSWORD" | mefor user add alice --role admin --password-stdin --json
  mefor user add lab-analyst --role viewer --channel 'lab-*' --password-stdin < pw.txt`
}

func (c *userAddCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

// maxPasswordInput bounds what --password-stdin reads.
const maxPasswordInput = 4096

// readPassword reads the first line of stdin, without its line ending.
func readPassword(r io.Reader) (string, error) {
	if r == nil {
		return "", errors.New("no standard input to read the password from")
	}
	b, err := io.ReadAll(io.LimitReader(r, maxPasswordInput+1))
	if err != nil {
		return "", fmt.Errorf("read the password from standard input: %w", err)
	}
	if len(b) > maxPasswordInput {
		return "", fmt.Errorf("standard input holds more than %d bytes: give only the password", maxPasswordInput)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return strings.TrimSuffix(string(line), "\r"), nil
}

func (c *userAddCmd) Run(ctx context.Context, g *Globals) error {
	if !c.PasswordStdin {
		return errors.New("give the password on standard input with --password-stdin (a password is never taken as an argument)")
	}
	pw, err := readPassword(g.stdin)
	if err != nil {
		return err
	}
	roles, err := customRoles(c.Role, c.Config)
	if err != nil {
		return err
	}
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	res, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (userChange, error) {
		u, enr, err := ops.UsersWithRoles(pool, kr, roles).AddUser(ctx, ops.NewUser{Name: c.Name, Role: c.Role, Channels: c.Channel, Password: pw})
		return userChange{u, enr}, err
	})
	if err != nil {
		return err
	}
	return reportEnrollment(g, kr, c.JSON, res, res.Enrollment,
		fmt.Sprintf("user %s added: role %s, channels %s", res.Name, res.Role, channelsText(res.Channels)))
}

// userChange is a user as a change left it, with the second factor the
// change enrolled, if any.
type userChange struct {
	ops.User
	*ops.Enrollment
}

// reportEnrollment prints the result of a change that may have enrolled a
// second factor: v as JSON, or line and the enrollment, shown only now;
// either way after warning when the secret is stored in clear.
func reportEnrollment(g *Globals, kr *crypt.Keyring, asJSON bool, v any, enr *ops.Enrollment, line string) error {
	warnClearTOTP(g, enr, kr)
	if asJSON {
		return writeJSON(g.stdout, v)
	}
	fmt.Fprintln(g.stdout, line)
	printEnrollment(g.stdout, enr)
	return nil
}

// warnClearTOTP says on stderr that a second factor was enrolled without
// MEFOR_ENCRYPTION_KEYS, so its secret is stored in clear.
func warnClearTOTP(g *Globals, enr *ops.Enrollment, kr *crypt.Keyring) {
	if enr != nil && !kr.Enabled() {
		fmt.Fprintf(g.stderr, "warning: %s is not set, so the TOTP secret is stored in clear (readable by mefor_admin only); "+
			"set it and run 'mefor user reset-mfa' to store it sealed (docs/access.md)\n", crypt.EnvKeys)
	}
}

// printEnrollment shows a new second factor, once.
func printEnrollment(w io.Writer, enr *ops.Enrollment) {
	if enr == nil {
		return
	}
	fmt.Fprintf(w, "\nTOTP (load into an authenticator app, or make a QR code of it; shown only now):\n  %s\n", enr.TOTPURI)
	fmt.Fprintln(w, "\nrecovery codes (each works once in place of a TOTP code; keep them offline; shown only now):")
	for _, c := range enr.RecoveryCodes {
		fmt.Fprintln(w, "  "+c)
	}
}

// customRoles reads the custom roles of the config file path, when role
// is not a built-in one: the roles a user may be given are the file's, as
// the nodes read them. A custom role without a file is refused here, with
// what to give.
func customRoles(role, path string) (map[string]ops.Role, error) {
	if path == "" {
		if role != "" && !slices.Contains(ops.UserRoles(), role) {
			return nil, fmt.Errorf("role %q is not built in (%s); a custom role is defined in the config's access.roles: give --config FILE",
				role, strings.Join(ops.UserRoles(), ", "))
		}
		return nil, nil
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	return cfg.Access.Roles, nil
}

func channelsText(ch []string) string {
	if len(ch) == 0 {
		return "all"
	}
	return strings.Join(ch, ",")
}

type userListCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *userListCmd) Help() string {
	return `Lists every user: role, channel patterns (all: no limit), whether a TOTP
second factor is enrolled, and whether the user is disabled or locked out (and
until when).

Examples:
  mefor user list
  mefor user list --json | jq '.[] | select(.disabled)'`
}

func (c *userListCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userListCmd) Run(ctx context.Context, g *Globals) error {
	list, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.User, error) {
		return ops.Users(pool, nil).ListUsers(ctx)
	})
	if err != nil {
		return err
	}
	return printList(g.stdout, c.JSON, list, listing[ops.User]{
		Empty:  "no users yet (add the first admin with 'mefor user add NAME --role admin --password-stdin')",
		Header: "NAME\tROLE\tCHANNELS\tMFA\tSTATE\tCREATED",
		Row: func(w io.Writer, u ops.User) {
			mfa := "no"
			switch {
			case u.SSO:
				mfa = "sso" // the provider's
			case u.MFA:
				mfa = "totp"
			}
			state := "active"
			switch {
			case u.Disabled:
				state = "disabled"
			case u.LockedUntil != nil:
				state = "locked until " + fmtTime(*u.LockedUntil)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", u.Name, u.Role, channelsText(u.Channels), mfa, state, fmtTime(u.CreatedAt))
		},
	})
}

type userSetCmd struct {
	Name        string   `arg:"" help:"User name."`
	Role        string   `name:"role" help:"New role: viewer, operator, admin, or a custom role of --config's access.roles."`
	Config      string   `name:"config" type:"existingfile" placeholder:"FILE" help:"Config file whose access.roles defines the custom role given to --role."`
	Channel     []string `name:"channel" placeholder:"PATTERN" help:"The user's channel patterns, replacing the old ones; repeat for more."`
	AllChannels bool     `name:"all-channels" help:"Lift the user's channel limit: every channel."`
	JSON        bool     `name:"json" help:"Print JSON (with totp_uri and recovery_codes when the new role enrolled MFA)."`
}

func (c *userSetCmd) Help() string {
	return `Changes a user's role or channel patterns. The user's open sessions end at
once, so no session keeps rights the user no longer has. Making a user without
a second factor an admin enrolls one and prints it.

Examples:
  mefor user set lab-analyst --role operator
  mefor user set lab-analyst --channel 'lab-*' --channel 'micro-*'
  mefor user set lab-analyst --all-channels`
}

func (c *userSetCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userSetCmd) Run(ctx context.Context, g *Globals) error {
	var ch ops.UserChange
	if c.Role != "" {
		ch.Role = &c.Role
	}
	switch {
	case c.AllChannels && len(c.Channel) > 0:
		return errors.New("give --channel or --all-channels, not both")
	case c.AllChannels:
		ch.Channels = &[]string{}
	case len(c.Channel) > 0:
		ch.Channels = &c.Channel
	}
	if ch.Role == nil && ch.Channels == nil {
		return errors.New("nothing to change: give --role, --channel or --all-channels")
	}
	roles, err := customRoles(c.Role, c.Config)
	if err != nil {
		return err
	}
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	res, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (userChange, error) {
		u, enr, err := ops.UsersWithRoles(pool, kr, roles).SetUser(ctx, c.Name, ch)
		return userChange{u, enr}, err
	})
	if err != nil {
		return err
	}
	return reportEnrollment(g, kr, c.JSON, res, res.Enrollment,
		fmt.Sprintf("user %s: role %s, channels %s; their sessions ended", res.Name, res.Role, channelsText(res.Channels)))
}

type userDisableCmd struct {
	Name string `arg:"" help:"User name."`
}

func (c *userDisableCmd) Help() string {
	return `Disables a user: logins are refused (with the answer a wrong password gets),
open sessions end, and the user's API tokens are refused until the user is
enabled again.

Examples:
  mefor user disable lab-analyst`
}

func (c *userDisableCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userDisableCmd) Run(ctx context.Context, g *Globals) error {
	return setDisabled(ctx, g, c.Name, true)
}

type userEnableCmd struct {
	Name string `arg:"" help:"User name."`
}

func (c *userEnableCmd) Help() string {
	return `Enables a disabled user again. It also ends a lockout (five failed logins
within 15 minutes) at once.

Examples:
  mefor user enable lab-analyst`
}

func (c *userEnableCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userEnableCmd) Run(ctx context.Context, g *Globals) error {
	return setDisabled(ctx, g, c.Name, false)
}

func setDisabled(ctx context.Context, g *Globals, name string, disabled bool) error {
	_, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (ops.User, error) {
		return ops.Users(pool, nil).SetDisabled(ctx, name, disabled)
	})
	if err != nil {
		return err
	}
	if disabled {
		fmt.Fprintf(g.stdout, "user %s disabled; their sessions ended\n", name)
	} else {
		fmt.Fprintf(g.stdout, "user %s enabled\n", name)
	}
	return nil
}

type userDeleteCmd struct {
	Name string `arg:"" help:"User name."`
}

func (c *userDeleteCmd) Help() string {
	return `Deletes a user with their sessions, API tokens and recovery codes. The audit
log keeps naming them. To keep the account for later, disable it instead.

Examples:
  mefor user delete lab-analyst`
}

func (c *userDeleteCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userDeleteCmd) Run(ctx context.Context, g *Globals) error {
	_, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		return struct{}{}, ops.Users(pool, nil).DeleteUser(ctx, c.Name)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "user %s deleted\n", c.Name)
	return nil
}

type userResetMFACmd struct {
	Name string `arg:"" help:"User name."`
	JSON bool   `name:"json" help:"Print JSON: totp_uri and recovery_codes."`
}

func (c *userResetMFACmd) Help() string {
	return `Gives a user a new TOTP secret and ten new recovery codes, printed this once;
the old secret and codes stop working at once. For a user who lost their
authenticator, or used up their recovery codes.

Examples:
  mefor user reset-mfa alice --json`
}

func (c *userResetMFACmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userResetMFACmd) Run(ctx context.Context, g *Globals) error {
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	enr, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (*ops.Enrollment, error) {
		return ops.Users(pool, kr).ResetMFA(ctx, c.Name)
	})
	if err != nil {
		return err
	}
	return reportEnrollment(g, kr, c.JSON, enr, enr, "user "+c.Name+" has a new second factor")
}

type userSessionsCmd struct {
	Name   string `arg:"" help:"User name."`
	Revoke bool   `name:"revoke" help:"End every open session of the user."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

func (c *userSessionsCmd) Help() string {
	return `Lists a user's login sessions (newest first): where from, when opened and
last used, when they end, and whether they are still active. With --revoke,
ends every open one instead.

Examples:
  mefor user sessions alice
  mefor user sessions alice --revoke`
}

func (c *userSessionsCmd) needsRole() string { return ops.RequiredRole(ops.OpUsers) }

func (c *userSessionsCmd) Run(ctx context.Context, g *Globals) error {
	if c.Revoke {
		n, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
			return ops.Users(pool, nil).RevokeSessions(ctx, c.Name)
		})
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(g.stdout, map[string]any{"user": c.Name, "sessions_revoked": n})
		}
		fmt.Fprintf(g.stdout, "%d sessions of %s ended\n", n, c.Name)
		return nil
	}
	list, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.Session, error) {
		return ops.Users(pool, nil).Sessions(ctx, c.Name)
	})
	if err != nil {
		return err
	}
	return printList(g.stdout, c.JSON, list, listing[ops.Session]{
		Empty:  "no sessions of " + c.Name,
		Header: "ID\tSOURCE\tCREATED\tLAST SEEN\tENDS\tSTATE",
		Row: func(w io.Writer, s ops.Session) {
			state := "active"
			switch {
			case s.RevokedAt != nil:
				state = "revoked " + fmtTime(*s.RevokedAt)
			case !s.Active:
				state = "expired"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(s.Source), fmtTime(s.CreatedAt), fmtTime(s.LastSeenAt),
				fmtTime(s.ExpiresAt), state)
		},
	})
}
