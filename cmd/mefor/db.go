package main

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/dbpool"
)

// errNoDatabase is returned by commands that need PostgreSQL when no URL was given.
var errNoDatabase = errors.New("no database: pass --database-url or set DATABASE_URL " +
	"(e.g. postgres://mefor:secret@localhost:5432/mefor); the commands that go through the API take --api and --token " +
	"(MEFOR_API_URL and MEFOR_API_TOKEN) or 'mefor login' instead")

// pool opens a connection pool and checks that the database answers, so a bad
// URL fails here with the host named rather than on a later query.
func (g *Globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	return g.poolWith(ctx, nil)
}

// poolWith is pool with a hook that adjusts the configuration first.
func (g *Globals) poolWith(ctx context.Context, adjust func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if g.DatabaseURL == "" {
		if g.apiGiven() {
			// A command that reaches this works on the database only.
			return nil, g.needsDatabase()
		}
		return nil, errNoDatabase
	}
	cfg, err := dbpool.CommandConfig(g.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if !g.AllowInsecureDatabase {
		if err := checkDatabaseTLS(&cfg.ConnConfig.Config, g.DatabaseURL); err != nil {
			return nil, err
		}
	}
	if adjust != nil {
		adjust(cfg)
	}
	return dbpool.Open(ctx, cfg)
}

// configAndPool loads a config file, then opens the database, for the
// commands that need both; the caller closes the pool.
func (g *Globals) configAndPool(ctx context.Context, path string) (*config.Config, *pgxpool.Pool, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cfg, pool, nil
}
