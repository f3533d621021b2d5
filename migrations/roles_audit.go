package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The audit log's writer (issue 49): mefor_audit and mefor_audit_anchor
// are written only by the SECURITY DEFINER functions of migration 019,
// owned, with the tables and the functions they call, by
// RoleAuditWriter, a NOLOGIN role nobody is a member of. Every other role
// reads the tables and calls the functions; none writes them.

// RoleAuditWriter owns the audit log and does nothing else.
const RoleAuditWriter = "mefor_audit_writer"

// auditTables are written only through auditAppendFunctions.
var auditTables = []string{"mefor_audit", "mefor_audit_anchor"}

// auditFunctions are the functions the writer owns: the definer functions
// and every function they call (an admin who owned one could replace it
// with one that runs as the writer).
const auditFunctions = `
	SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	WHERE n.nspname = $1 AND p.proname LIKE 'mefor\_audit\_%'`

// auditExecute says which role may call each definer function: everyone
// with a mefor role appends (a refused attempt is recorded too); anchors
// are the nodes'.
var auditExecute = map[string]string{
	"mefor_audit_append(text, text, text, text, text, text)":               RoleReader,
	"mefor_audit_anchor_add(bigint, bigint, text, text, text, text, text)": RoleAdmin,
}

// isAuditObject reports whether handOver must leave an object (as
// ownedObjects names it) to the writer.
func isAuditObject(obj string) bool {
	for _, t := range auditTables {
		if obj == "TABLE "+t {
			return true
		}
	}
	return strings.HasPrefix(obj, "FUNCTION mefor_audit_")
}

// ensureAuditWriter creates RoleAuditWriter when it does not exist.
func ensureAuditWriter(ctx context.Context, conn *pgx.Conn, res *RolesResult) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", RoleAuditWriter).Scan(&exists); err != nil {
		return fmt.Errorf("look up role %s: %w", RoleAuditWriter, err)
	}
	if exists {
		return nil
	}
	_, err := conn.Exec(ctx, "CREATE ROLE "+RoleAuditWriter+" NOLOGIN")
	switch {
	case err == nil:
		res.Created = append(res.Created, RoleAuditWriter)
	case sqlState(err, codeDuplicateObject, codeUniqueViolation):
	case IsPermissionDenied(err):
		return &RolesError{Step: "create role " + RoleAuditWriter, Err: err, SQL: "CREATE ROLE " + RoleAuditWriter + " NOLOGIN;"}
	default:
		return fmt.Errorf("create role %s: %w", RoleAuditWriter, err)
	}
	return nil
}

// auditGrants are the grant statements on the audit tables: read by every
// role, written by none directly.
func auditGrants(table string) []string {
	id := pgx.Identifier{table}.Sanitize()
	return []string{
		"REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON " + id + " FROM PUBLIC, " + strings.Join(Roles, ", "),
		"GRANT SELECT ON " + id + " TO " + RoleReader,
	}
}

// protectAudit hands the audit tables and functions to RoleAuditWriter and
// lets the roles call the definer functions. Changing an owner needs the
// migrating role to be a superuser or to join the writer for the moment
// (CREATEROLE); it leaves the writer again at once. Without that it changes
// nothing and records why in res.AuditSkipped.
func protectAudit(ctx context.Context, tx pgx.Tx, schema string, res *RolesResult) error {
	rows, err := tx.Query(ctx, auditFunctions, schema)
	if err != nil {
		return fmt.Errorf("list the audit log's functions: %w", err)
	}
	funcs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list the audit log's functions: %w", err)
	}
	var objs []string
	for _, t := range auditTables {
		objs = append(objs, "TABLE "+pgx.Identifier{t}.Sanitize())
	}
	for _, f := range funcs {
		objs = append(objs, "FUNCTION "+f)
	}
	// The calls first, while the migrating role may still own the
	// functions (a hand-over keeps their grants); a later run by an admin,
	// who owns nothing of the log, finds nothing to change.
	var stmts []string
	for f, role := range auditExecute {
		var public, granted bool
		err := tx.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
				WHERE p.oid = $1::regprocedure AND a.grantee = 0),
			has_function_privilege($2, $1, 'EXECUTE')`, f, role).Scan(&public, &granted)
		if err != nil {
			return fmt.Errorf("look up who may call %s: %w", f, err)
		}
		if public {
			stmts = append(stmts, "REVOKE EXECUTE ON FUNCTION "+f+" FROM PUBLIC")
		}
		if !granted {
			stmts = append(stmts, "GRANT EXECUTE ON FUNCTION "+f+" TO "+role)
		}
	}
	var usage bool
	if err := tx.QueryRow(ctx, `SELECT has_schema_privilege($1, $2, 'USAGE')`, RoleAuditWriter, schema).Scan(&usage); err != nil {
		return fmt.Errorf("look up %s's privileges on schema %s: %w", RoleAuditWriter, schema, err)
	}
	if !usage {
		stmts = append(stmts, "GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+RoleAuditWriter)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			if IsPermissionDenied(err) {
				return &RolesError{Step: "grant the audit log's functions", Err: err, SQL: "(as a superuser) mefor migrate"}
			}
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	var stale bool
	err = tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = ANY($2) AND pg_get_userbyid(c.relowner) <> $3)
		OR EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 AND p.proname LIKE 'mefor\_audit\_%' AND pg_get_userbyid(p.proowner) <> $3)`,
		schema, auditTables, RoleAuditWriter).Scan(&stale)
	if err != nil {
		return fmt.Errorf("look up the audit log's owner: %w", err)
	}
	if stale {
		var super bool
		if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
			return fmt.Errorf("look up the current role: %w", err)
		}
		ok, err := savepoint(ctx, tx, func() error {
			stmts := []string{"GRANT USAGE, CREATE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + RoleAuditWriter}
			if !super {
				stmts = append(stmts, "GRANT "+RoleAuditWriter+" TO CURRENT_USER")
			}
			for _, o := range objs {
				stmts = append(stmts, "ALTER "+o+" OWNER TO "+RoleAuditWriter)
			}
			if !super {
				stmts = append(stmts, "REVOKE "+RoleAuditWriter+" FROM CURRENT_USER")
			}
			// The writer creates nothing: CREATE was only for the hand-over.
			stmts = append(stmts, "REVOKE CREATE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" FROM "+RoleAuditWriter)
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("hand the audit log to %s: %w", RoleAuditWriter, err)
		}
		if !ok {
			res.AuditSkipped = "the migrating role cannot hand the audit log to " + RoleAuditWriter +
				" (that needs a superuser, or CREATEROLE and ownership of the tables): until then its owner may rewrite it; " +
				"run 'mefor migrate' once as a superuser or the database owner with CREATEROLE"
			return nil
		}
	}
	return nil
}
