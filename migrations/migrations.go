// Package migrations applies the database schema mefor runs on: River's own
// tables (through rivermigrate) and mefor's embedded, versioned SQL files.
//
// Migrations run under a session advisory lock, so two nodes running
// `mefor migrate` at the same time serialize: the second one waits, then finds
// nothing left to do. mefor's own versions apply in one transaction.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed sql/*.sql
var sqlFS embed.FS

// lockKey is the advisory lock taken while migrating ("mefor" + "mig").
const lockKey int64 = 0x6d65666f726d6967

// Migration is one of mefor's own schema versions.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Status is one line of `mefor migrate --status`.
type Status struct {
	Line      string     `json:"line"` // "river" or "mefor"
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

// Result says what a Migrate call applied.
type Result struct {
	River []int `json:"river_applied"`
	Mefor []int `json:"mefor_applied"`
}

// All returns mefor's own migrations in version order. File names are
// NNN_name.sql; a malformed name is reported as an error (and fails the tests).
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(sqlFS, "sql")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("migration file %q: want NNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration file %q: version %q is not a number", e.Name(), num)
		}
		body, err := fs.ReadFile(sqlFS, path.Join("sql", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations share version %d", out[i].Version)
		}
	}
	return out, nil
}

// Migrate brings the database up to date: River's migrations first (mefor's
// tables do not reference them, but the drainers need both), then mefor's.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*Result, error) {
	return MigrateTo(ctx, pool, logger, 0)
}

// MigrateTo is Migrate applying mefor's migrations up to version only (0:
// all), as an older release would have: the upgrade tests start there.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, version int) (*Result, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}

	// A session lock on a connection of its own serializes concurrent
	// migrators. River's migrations cannot share one transaction (a later one
	// uses an enum value an earlier one adds), so River runs each in its own
	// transaction while this connection holds the lock.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for migration lock: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must be released even if ctx ended.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey)
	}()

	res := &Result{}
	riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	for _, v := range riverRes.Versions {
		res.River = append(res.River, v.Version)
	}

	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, createTrackingTable); err != nil {
			return fmt.Errorf("create mefor_migration: %w", err)
		}
		applied, err := appliedVersions(ctx, tx)
		if err != nil {
			return err
		}
		for _, m := range all {
			if _, ok := applied[m.Version]; ok || (version > 0 && m.Version > version) {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx,
				"INSERT INTO mefor_migration (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %03d_%s: %w", m.Version, m.Name, err)
			}
			res.Mefor = append(res.Mefor, m.Version)
			logger.InfoContext(ctx, "applied migration", "line", "mefor", "version", m.Version, "name", m.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// StatusOf lists every known migration, River's and mefor's, and whether it
// has been applied. It changes nothing.
func StatusOf(ctx context.Context, pool *pgxpool.Pool) ([]Status, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}

	var out []Status
	// rivermigrate reports which versions exist but not when they were applied.
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return nil, fmt.Errorf("river migration status: %w", err)
	}
	riverApplied := map[int]bool{}
	for _, m := range existing {
		riverApplied[m.Version] = true
	}
	for _, m := range migrator.AllVersions() {
		out = append(out, Status{Line: "river", Version: m.Version, Name: m.Name, Applied: riverApplied[m.Version]})
	}

	applied, err := appliedVersions(ctx, pool)
	if err != nil && !isUndefinedTable(err) {
		return nil, err
	}
	for _, m := range all {
		s := Status{Line: "mefor", Version: m.Version, Name: m.Name}
		if at, ok := applied[m.Version]; ok {
			s.Applied, s.AppliedAt = true, &at
		}
		out = append(out, s)
	}
	return out, nil
}

// Pending reports whether any migration, River's or mefor's, is not applied.
func Pending(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	st, err := StatusOf(ctx, pool)
	if err != nil {
		return false, err
	}
	for _, s := range st {
		if !s.Applied {
			return true, nil
		}
	}
	return false, nil
}

const createTrackingTable = `
CREATE TABLE IF NOT EXISTS mefor_migration (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func appliedVersions(ctx context.Context, q querier) (map[int]time.Time, error) {
	rows, err := q.Query(ctx, "SELECT version, applied_at FROM mefor_migration")
	if err != nil {
		return nil, fmt.Errorf("read mefor_migration: %w", err)
	}
	out := map[int]time.Time{}
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("scan mefor_migration: %w", err)
		}
		out[v] = at
	}
	return out, rows.Err()
}
