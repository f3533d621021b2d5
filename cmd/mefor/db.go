package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/store"
)

// errNoDatabase is returned by commands that need PostgreSQL when no URL was given.
var errNoDatabase = errors.New("no database: pass --database-url or set DATABASE_URL " +
	"(e.g. postgres://mefor:secret@localhost:5432/mefor)")

// defaultMaxConns is the pool size unless the URL sets pool_max_conns.
const defaultMaxConns = 20

// pool opens a connection pool and checks that the database answers, so a bad
// URL fails here with the host named rather than on a later query.
func (g *Globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	return g.poolWith(ctx, nil)
}

// poolWith is pool with a hook that adjusts the configuration first.
func (g *Globals) poolWith(ctx context.Context, adjust func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if g.DatabaseURL == "" {
		return nil, errNoDatabase
	}
	cfg, err := pgxpool.ParseConfig(g.DatabaseURL)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, errors.New("database URL is not valid: want postgres://user:password@host:port/dbname")
	}
	if !g.AllowInsecureDatabase {
		if err := checkDatabaseTLS(&cfg.ConnConfig.Config, g.DatabaseURL); err != nil {
			return nil, err
		}
	}
	if !strings.Contains(g.DatabaseURL, "pool_max_conns") {
		// pgx's default (4 on a 2-core host) starves a node whose stage
		// drainers each hold a connection per hand-off; connections are
		// opened on demand, so a CLI command still uses one or two.
		cfg.MaxConns = defaultMaxConns
	}
	// Every command that stores or changes messages (enqueue, replay,
	// cancel, run) must not be answered before its commit is on disk.
	store.DurableCommits(&cfg.ConnConfig.Config)
	if adjust != nil {
		adjust(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
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
