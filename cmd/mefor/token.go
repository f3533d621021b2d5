package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/ops"
)

type tokenCmd struct {
	Create tokenCreateCmd `cmd:"" help:"Create an API token acting as a user; the token is printed once."`
	List   tokenListCmd   `cmd:"" help:"List API tokens: user, created, expires, last used, revoked."`
	Revoke tokenRevokeCmd `cmd:"" help:"Revoke an API token by its id."`
}

func (c *tokenCmd) Help() string {
	return `API tokens let scripts and the CLI call the API as a user, without a password
or TOTP code (Authorization: Bearer ...). A token acts with its user's current
role and channels, is refused while the user is disabled, and ends when it
expires or is revoked. Only its SHA-256 is stored: it is shown once, when it is
created. These commands run with the database URL of a member of mefor_admin.

Examples:
  mefor token create --user ci --expires 30d
  mefor token list
  mefor token revoke 7`
}

type tokenCreateCmd struct {
	User    string `name:"user" required:"" placeholder:"NAME" help:"The user the token acts as."`
	Expires string `name:"expires" default:"90d" placeholder:"DURATION" help:"How long the token is valid: 90d, 12h, or never. Defaults to 90d."`
	JSON    bool   `name:"json" help:"Print JSON: id, user, expires_at and token."`
}

func (c *tokenCreateCmd) Help() string {
	return `Creates an API token for a user and prints it once on standard output (the
details go to standard error), so it can be captured by a script. It cannot be
shown again: only its hash is stored. Lost tokens are revoked and made anew.

Examples:
  TOKEN=$(mefor token create --user ci --expires 30d)
  mefor token create --user ci --json`
}

func (c *tokenCreateCmd) needsRole() string { return ops.RequiredRole(ops.OpTokens) }

// parseExpiry reads --expires as the API's POST /api/v1/tokens does.
func parseExpiry(s string) (time.Duration, error) {
	d, err := ops.ParseTokenExpiry(s)
	if err != nil {
		return 0, fmt.Errorf("--expires %q: give a duration such as 90d or 12h, or never", s)
	}
	return d, nil
}

func (c *tokenCreateCmd) Run(ctx context.Context, g *Globals) error {
	ttl, err := parseExpiry(c.Expires)
	if err != nil {
		return err
	}
	type created struct {
		ops.APIToken
		Token string `json:"token"`
	}
	res, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (created, error) {
		tok, secret, err := ops.Users(pool, nil).CreateToken(ctx, c.User, ttl)
		return created{tok, secret}, err
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	expires := "never"
	if res.ExpiresAt != nil {
		expires = fmtTime(*res.ExpiresAt)
	}
	fmt.Fprintf(g.stderr, "token %d for user %s, expires %s; it is shown only this once\n", res.ID, res.User, expires)
	fmt.Fprintln(g.stdout, res.Token)
	return nil
}

type tokenListCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *tokenListCmd) Help() string {
	return `Lists every API token, newest first, without the tokens themselves.

Examples:
  mefor token list
  mefor token list --json | jq '.[] | select(.revoked_at == null)'`
}

func (c *tokenListCmd) needsRole() string { return ops.RequiredRole(ops.OpTokens) }

func (c *tokenListCmd) Run(ctx context.Context, g *Globals) error {
	list, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.APIToken, error) {
		return ops.Users(pool, nil).ListTokens(ctx)
	})
	if err != nil {
		return err
	}
	optTime := func(t *time.Time, none string) string {
		if t == nil {
			return none
		}
		return fmtTime(*t)
	}
	return printList(g.stdout, c.JSON, list, listing[ops.APIToken]{
		Empty:  "no API tokens (create one with 'mefor token create --user NAME')",
		Header: "ID\tUSER\tCREATED\tEXPIRES\tLAST USED\tREVOKED",
		Row: func(w io.Writer, t ops.APIToken) {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.User, fmtTime(t.CreatedAt), optTime(t.ExpiresAt, "never"),
				optTime(t.LastUsedAt, "-"), optTime(t.RevokedAt, "-"))
		},
	})
}

type tokenRevokeCmd struct {
	ID int64 `arg:"" help:"Token id (from token list)."`
}

func (c *tokenRevokeCmd) Help() string {
	return `Revokes an API token: it is refused from the next request on.

Examples:
  mefor token revoke 7`
}

func (c *tokenRevokeCmd) needsRole() string { return ops.RequiredRole(ops.OpTokens) }

func (c *tokenRevokeCmd) Run(ctx context.Context, g *Globals) error {
	_, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		return struct{}{}, ops.Users(pool, nil).RevokeToken(ctx, c.ID)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "token %d revoked\n", c.ID)
	return nil
}
