package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/mefor/mefor/migrations"
)

type migrateCmd struct {
	Status bool `help:"List every migration and whether it is applied; change nothing."`
	JSON   bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *migrateCmd) Help() string {
	return `Applies River's migrations and mefor's own, in one transaction under an advisory
lock: safe to run on every node at start-up, and a no-op when up to date.

It also sets up the database roles that control who may do what (see
docs/security.md, "Database roles"): it creates the NOLOGIN roles mefor_reader,
mefor_operator and mefor_admin if they do not exist (this needs CREATEROLE or
a superuser the first time), grants them their privileges in this database,
and makes mefor_admin the owner of mefor's tables so that any admin can run
later migrations. Grant a role to a login role with, e.g.:
  GRANT mefor_operator TO alice;

Examples:
  mefor migrate --database-url 'postgres://mefor:secret@db.example.org:5432/mefor?sslmode=verify-full&sslrootcert=/etc/mefor/tls/db-ca.crt'
  mefor migrate --status`
}

func (c *migrateCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if c.Status {
		st, err := migrations.StatusOf(ctx, pool)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(g.stdout, st)
		}
		tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LINE\tVERSION\tNAME\tSTATE")
		for _, s := range st {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.Line, s.Version, s.Name, state)
		}
		return tw.Flush()
	}

	res, err := migrations.Migrate(ctx, pool, g.logger)
	if err != nil {
		return err
	}
	roles, err := migrations.ApplyRoles(ctx, pool, g.logger)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, struct {
			*migrations.Result
			*migrations.RolesResult
		}{res, roles})
	}
	if len(res.River)+len(res.Mefor) == 0 {
		fmt.Fprintln(g.stdout, "database is up to date")
	} else {
		fmt.Fprintf(g.stdout, "applied %d River and %d mefor migrations\n", len(res.River), len(res.Mefor))
	}
	if len(roles.Created) > 0 {
		fmt.Fprintf(g.stdout, "created roles %s\n", strings.Join(roles.Created, ", "))
	}
	if roles.Owned > 0 {
		fmt.Fprintf(g.stdout, "%s now owns %d tables, sequences, types and functions\n", migrations.RoleAdmin, roles.Owned)
	}
	if roles.DatabaseClosed {
		fmt.Fprintf(g.stdout, "revoked CONNECT and TEMP on this database from PUBLIC; %s and the roles that include it may connect\n", migrations.RoleReader)
	}
	if roles.LocksClosed {
		fmt.Fprintf(g.stdout, "revoked PostgreSQL's advisory lock functions from PUBLIC in this database; only %s (and %s, for its transaction) may take locks\n",
			migrations.RoleAdmin, migrations.RoleOperator)
	}
	for _, u := range roles.Unsecured {
		fmt.Fprintf(g.stderr, "mefor: warning: %s\n", u)
	}
	if roles.OwnerSkipped != "" {
		fmt.Fprintf(g.stderr, "mefor: warning: %s does not own mefor's tables, so admins cannot migrate: %s\n",
			migrations.RoleAdmin, roles.OwnerSkipped)
	}
	if roles.AuditSkipped != "" {
		fmt.Fprintf(g.stderr, "mefor: warning: %s\n", roles.AuditSkipped)
	}
	return nil
}
