package migrations

import (
	"errors"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes this package and its callers branch on.
const (
	codeInsufficientPrivilege = "42501"
	codeInvalidGrantOperation = "0LP01"
	codeDuplicateObject       = "42710"
	codeUniqueViolation       = "23505"
	codeUndefinedTable        = "42P01"
	codeInternalError         = "XX000"
)

// IsPermissionDenied reports whether err is a refusal for lack of
// privilege: the database's own (SQLSTATE 42501, insufficient_privilege),
// or RequireRole's, which takes the same form so callers need one test.
// Callers name the role an action needs, and audit the attempt as denied
// rather than failed.
func IsPermissionDenied(err error) bool {
	return sqlState(err, codeInsufficientPrivilege)
}

// permissionDenied is the refusal RequireRole returns, shaped as the
// database's own.
func permissionDenied(message string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: codeInsufficientPrivilege, Message: message}
}

// isConcurrentCatalogUpdate reports whether err is PostgreSQL's internal
// error for two sessions changing one catalog row at the same moment (a
// GRANT of one membership from two databases at once). It has no SQLSTATE
// of its own, so the message tells it from other internal errors.
func isConcurrentCatalogUpdate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeInternalError && pgErr.Message == "tuple concurrently updated"
}

func isUndefinedTable(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == codeUndefinedTable
}

func sqlState(err error, codes ...string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && slices.Contains(codes, pgErr.Code)
}
