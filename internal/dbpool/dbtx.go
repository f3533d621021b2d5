package dbpool

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what a package's statements run on: a pool, a connection or a
// transaction. The packages that own tables take it (under their own name
// for it) so a caller decides whether a statement joins its transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Rows runs sql on q and returns its rows as scan reads each. what says
// what the query is for; any error is wrapped with it.
func Rows[T any](ctx context.Context, q DBTX, what string, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	vals, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return vals, nil
}

// Column runs sql on q and returns the one column it selects, a value a
// row. what says what the query is for; any error is wrapped with it.
func Column[T any](ctx context.Context, q DBTX, what, sql string, args ...any) ([]T, error) {
	return Rows(ctx, q, what, pgx.RowTo[T], sql, args...)
}
