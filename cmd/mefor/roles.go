package main

import (
	"errors"
	"fmt"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/ops"
)

// roleNeeder is a command that needs more than mefor_reader, the role of
// every command that does not say. The policy itself is ops.RequiredRole.
type roleNeeder interface {
	needsRole() string
}

func (c *messagesShowCmd) needsRole() string {
	if c.Body {
		return ops.RequiredRole(ops.OpMessagesShowBody)
	}
	return ops.RoleReader
}

func (c *messagesListCmd) needsRole() string {
	switch {
	case c.Text != "":
		return ops.RequiredRole(ops.OpMessagesSearch)
	case c.Patient != "":
		return ops.RequiredRole(ops.OpMessagesPatient)
	}
	return ops.RoleReader
}

func (c *replayCmd) needsRole() string         { return ops.RequiredRole(ops.OpReplay) }
func (c *replayDeadCmd) needsRole() string     { return ops.RequiredRole(ops.OpReplayDead) }
func (c *cancelCmd) needsRole() string         { return ops.RequiredRole(ops.OpCancel) }
func (c *enqueueCmd) needsRole() string        { return ops.RequiredRole(ops.OpEnqueue) }
func (c *runCmd) needsRole() string            { return ops.RequiredRole(ops.OpRun) }
func (c *stepdownCmd) needsRole() string       { return ops.RequiredRole(ops.OpStepdown) }
func (c *reloadCmd) needsRole() string         { return ops.RequiredRole(ops.OpReload) }
func (c *maintenanceRunCmd) needsRole() string { return ops.RequiredRole(ops.OpMaintenanceRun) }
func (c *referenceSyncCmd) needsRole() string  { return ops.RequiredRole(ops.OpReferenceSync) }
func (c *referenceShowCmd) needsRole() string  { return ops.RequiredRole(ops.OpReferenceShow) }
func (c *migrateCmd) needsRole() string {
	if c.Status {
		return ops.RoleReader
	}
	return ops.RequiredRole(ops.OpMigrate)
}

// explainDenied turns the database's refusal for lack of privilege
// (SQLSTATE 42501) into one line naming the role the command needs and how
// to get it; other errors pass through.
func explainDenied(kctx *kong.Context, g *Globals, err error) error {
	var pgErr *pgconn.PgError
	if !ops.IsPermissionDenied(err) || !errors.As(err, &pgErr) {
		return err
	}
	role := ops.RoleReader
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
