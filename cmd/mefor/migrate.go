package main

import (
	"context"
	"fmt"
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
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	if len(res.River)+len(res.Mefor) == 0 {
		fmt.Fprintln(g.stdout, "database is up to date")
		return nil
	}
	fmt.Fprintf(g.stdout, "applied %d River and %d mefor migrations\n", len(res.River), len(res.Mefor))
	return nil
}
