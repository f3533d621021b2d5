package main

import (
	"errors"
	"fmt"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/migrations"
)

// roleNeeder is a command that needs more than mefor_reader, the role of
// every command that does not say.
type roleNeeder interface {
	needsRole() string
}

func (c *messagesShowCmd) needsRole() string {
	if c.Body {
		return migrations.RoleOperator
	}
	return migrations.RoleReader
}

func (c *messagesListCmd) needsRole() string {
	if c.Text != "" {
		return migrations.RoleOperator
	}
	return migrations.RoleReader
}

func (c *replayCmd) needsRole() string         { return migrations.RoleOperator }
func (c *replayDeadCmd) needsRole() string     { return migrations.RoleOperator }
func (c *cancelCmd) needsRole() string         { return migrations.RoleOperator }
func (c *enqueueCmd) needsRole() string        { return migrations.RoleOperator }
func (c *runCmd) needsRole() string            { return migrations.RoleAdmin }
func (c *stepdownCmd) needsRole() string       { return migrations.RoleAdmin }
func (c *reloadCmd) needsRole() string         { return migrations.RoleAdmin }
func (c *maintenanceRunCmd) needsRole() string { return migrations.RoleAdmin }
func (c *referenceSyncCmd) needsRole() string  { return migrations.RoleAdmin }
func (c *referenceShowCmd) needsRole() string  { return migrations.RoleOperator }
func (c *migrateCmd) needsRole() string {
	if c.Status {
		return migrations.RoleReader
	}
	return migrations.RoleAdmin
}

// explainDenied turns the database's refusal for lack of privilege
// (SQLSTATE 42501) into one line naming the role the command needs and how
// to get it; other errors pass through.
func explainDenied(kctx *kong.Context, g *Globals, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return err
	}
	role := migrations.RoleReader
	if n := kctx.Selected(); n != nil && n.Target.CanAddr() {
		if r, ok := n.Target.Addr().Interface().(roleNeeder); ok {
			role = r.needsRole()
		}
	}
	user := "your database user"
	if cfg, perr := pgx.ParseConfig(g.DatabaseURL); perr == nil && cfg.User != "" {
		user = "database user " + cfg.User
	}
	return &exitError{code: 1, err: fmt.Errorf("permission denied: 'mefor %s' needs the %s role, which %s does not have "+
		"(an administrator grants it: GRANT %s TO <user>; see 'mefor migrate --help'); the database said: %s",
		kctx.Command(), role, user, role, pgErr.Message)}
}
