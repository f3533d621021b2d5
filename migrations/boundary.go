package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// advisoryLockFunctions are PostgreSQL's functions that take an advisory
// lock. Lane exclusion, the finalizer, transform state keys, layout
// numbering and the audit log lock with their two-integer forms, and any
// session that may call them could take those locks and hold intake and
// delivery. Only those forms are closed: the single bigint key space does
// not overlap them, and the migration lock (a bigint) must stay open to a
// database owner who migrates without being mefor_admin.
var advisoryLockFunctions = []string{
	"pg_advisory_lock", "pg_advisory_lock_shared",
	"pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
	"pg_try_advisory_lock", "pg_try_advisory_lock_shared",
	"pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
}

// operatorLockFunction is the advisory lock function releases before
// migration 024 granted operators for their writes' lane locks. Their
// writes now lock inside functions that run as their owner, so it is
// taken back: no lock function is left to any role but mefor_admin.
const operatorLockFunction = "pg_catalog.pg_advisory_xact_lock(integer, integer)"

// closeBoundary closes mefor's database to logins without a mefor role
// (CONNECT and TEMP revoked from PUBLIC, CONNECT granted to mefor_reader,
// which every mefor role includes) and PostgreSQL's advisory lock functions
// to every role but mefor_admin (taking back pg_advisory_xact_lock(int,
// int) from operators, who held it before). Both changes are local to this database.
//
// The database needs its owner (or a superuser); the functions belong to
// the bootstrap superuser, so only a superuser can close them. What the
// migrating role cannot do is left as it is and reported in
// res.Unsecured with the SQL that does it; what it did is in
// res.DatabaseClosed and res.LocksClosed.
func closeBoundary(ctx context.Context, tx pgx.Tx, res *RolesResult) error {
	var db string
	var super, owner, open bool
	err := tx.QueryRow(ctx, `
		SELECT d.datname, r.rolsuper, pg_has_role(current_user, d.datdba, 'USAGE'),
			has_database_privilege('public', d.oid, 'CONNECT') OR has_database_privilege('public', d.oid, 'TEMP')
		FROM pg_database d, pg_roles r
		WHERE d.datname = current_database() AND r.rolname = current_user`).Scan(&db, &super, &owner, &open)
	if err != nil {
		return fmt.Errorf("look up the database's privileges: %w", err)
	}
	dbID := pgx.Identifier{db}.Sanitize()
	dbSQL := []string{
		"REVOKE CONNECT, TEMPORARY ON DATABASE " + dbID + " FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + dbID + " TO " + RoleReader,
	}
	switch {
	case !open:
		// Already closed; CONNECT for mefor's roles is granted again below
		// in case someone revoked it.
		if super || owner {
			if _, err := tx.Exec(ctx, dbSQL[1]); err != nil {
				return fmt.Errorf("%s: %w", dbSQL[1], err)
			}
		}
	case super || owner:
		for _, s := range dbSQL {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		res.DatabaseClosed = true
	default:
		res.Unsecured = append(res.Unsecured, fmt.Sprintf(
			"any login may connect to database %s and create temporary tables; as its owner or a superuser run: %s;",
			db, strings.Join(dbSQL, "; ")))
	}

	rows, err := tx.Query(ctx, `
		SELECT p.oid::regprocedure::text, has_function_privilege('public', p.oid, 'EXECUTE')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'pg_catalog' AND p.proname = ANY($1) AND p.proargtypes = '23 23'::oidvector
		ORDER BY 1`, advisoryLockFunctions)
	if err != nil {
		return fmt.Errorf("list advisory lock functions: %w", err)
	}
	type fn struct {
		sig  string
		open bool
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		err := r.Scan(&f.sig, &f.open)
		return f, err
	})
	if err != nil {
		return fmt.Errorf("list advisory lock functions: %w", err)
	}
	var lockSQL []string
	anyOpen := false
	for _, f := range fns {
		anyOpen = anyOpen || f.open
		lockSQL = append(lockSQL,
			"REVOKE EXECUTE ON FUNCTION pg_catalog."+f.sig+" FROM PUBLIC",
			"GRANT EXECUTE ON FUNCTION pg_catalog."+f.sig+" TO "+RoleAdmin)
	}
	lockSQL = append(lockSQL, "REVOKE EXECUTE ON FUNCTION "+operatorLockFunction+" FROM "+RoleOperator)
	switch {
	case super:
		for _, s := range lockSQL {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		res.LocksClosed = anyOpen
	case anyOpen:
		res.Unsecured = append(res.Unsecured, fmt.Sprintf(
			"any login that can connect may take mefor's lane locks and hold intake; connected to database %s as a superuser run: %s;",
			db, strings.Join(lockSQL, "; ")))
	}
	return nil
}
