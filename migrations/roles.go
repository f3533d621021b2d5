package migrations

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/internal/dbpool"
)

// The database roles an administrator grants to login roles. Each includes
// the one before: an operator can do what a reader can, an admin what an
// operator can.
const (
	// RoleReader may read status, listings and messages without their
	// content.
	RoleReader = "mefor_reader"
	// RoleOperator may also read content (messages show --body), replay,
	// cancel and enqueue, each only through a function that audits it
	// (operatorReadFunctions, operatorWriteFunctions).
	RoleOperator = "mefor_operator"
	// RoleAdmin may do everything: stepdown, reload, maintenance runs,
	// keys, migrate, and run a node. It owns mefor's and River's tables
	// when the migrating role could hand them over (see ApplyRoles).
	RoleAdmin = "mefor_admin"
)

// Roles lists the roles, least privileged first.
var Roles = []string{RoleReader, RoleOperator, RoleAdmin}

// contentColumns are the columns that hold message content, by table. A
// reader gets SELECT on every other column of these tables and on every
// other table, never on these. A column added to a table here that holds
// content must be added to this list.
var contentColumns = map[string][]string{
	"mefor_message":       {"raw"},
	"mefor_work":          {"payload"},
	"mefor_response":      {"body"},
	"mefor_state":         {"key", "value", "key_sealed"},
	"mefor_reference_row": {"value"},
}

// readerHiddenColumns are the columns, besides contentColumns, a reader
// may not read: the patient search column (the MRN in clear when
// encryption is off) and error and event texts, which can quote the
// message. Operators read them (opening sealed ones is audited by ops).
var readerHiddenColumns = map[string][]string{
	"mefor_message": {"patient_key", "error"},
	"mefor_work":    {"last_error"},
	"mefor_event":   {"detail"},
}

// operatorHiddenColumns are the content columns an operator may not read
// directly: it reads them only through operatorReadFunctions, which append
// the audit row in the same transaction. Admins (and the nodes) read them.
var operatorHiddenColumns = map[string][]string{
	"mefor_message":       {"raw"},
	"mefor_state":         {"key", "value", "key_sealed"},
	"mefor_work":          {"payload"},
	"mefor_response":      {"body"},
	"mefor_reference_row": {"value"},
}

// operatorReadFunctions are the SECURITY DEFINER functions of migration
// 022 through which an operator reads what it may not SELECT.
var operatorReadFunctions = []string{
	"mefor_read_body(bigint, text, text, text)",
	"mefor_key_census()",
	"mefor_unbound_count()",
	"mefor_search_bodies(bigint[], bytea, text, text, text)",
	"mefor_read_reference(text, text, integer, text, text)",
}

// readerExcluded is every column of table a reader may not read.
func readerExcluded(table string) []string {
	return append(slices.Clone(contentColumns[table]), readerHiddenColumns[table]...)
}

// credentialTables hold people's credentials (password hashes, TOTP
// secrets, hashes of session and API tokens and recovery codes; package
// internal/identity, migration 023; SSO logins under way, 025). Readers and operators get no
// privilege on them, not even on their sequences: only mefor_admin (the
// nodes, and administrators running `mefor user` and `mefor token`) reads
// or writes them.
var credentialTables = []string{"mefor_user", "mefor_user_recovery_code", "mefor_session", "mefor_api_token", "mefor_sso_login"}

// credentialSequence reports whether sequence belongs to a credential
// table (its serial id).
func credentialSequence(sequence string) bool {
	for _, t := range credentialTables {
		if sequence == t+"_id_seq" {
			return true
		}
	}
	return false
}

// operatorWriteFunctions are the SECURITY DEFINER functions of migration
// 024 through which an operator changes the pipeline: replay, replay-dead,
// cancel (and its cancel of marked rows whose drainer stopped) and
// enqueue. Each does one operation's state transitions in the pipeline's
// lock order, activates or wakes the lanes it put work into, and appends
// its audit row. Operators hold no INSERT, UPDATE or DELETE on any table
// (writeRevokes), nor USAGE or UPDATE on any sequence.
var operatorWriteFunctions = []string{
	"mefor_replay(bigint, text, text, text)",
	"mefor_replay_dead(text, text, bigint, bigint, integer, text, text, text)",
	"mefor_cancel(text, text, boolean, bigint, bigint, integer, text, text, text)",
	"mefor_cancel_marked_idle(text[], text, text, text)",
	"mefor_enqueue_id()",
	"mefor_enqueue(bigint, text, text, text, text, text, text, integer, bytea, text, text, text, text, text)",
}

// writeRevokes takes from readers and operators every write on table: an
// older release gave operators INSERT and UPDATE on the pipeline tables
// (table-wide, then column by column) and on river_job and mefor_lane, and
// a table-level REVOKE takes the column grants with it, so every run ends
// in the same place. mefor_admin's ALL is granted separately; a reader
// includes in no role that writes.
func writeRevokes(table string) []string {
	return []string{"REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON " + pgx.Identifier{table}.Sanitize() +
		" FROM " + RoleReader + ", " + RoleOperator}
}

// RolesResult says what ApplyRoles changed.
type RolesResult struct {
	Created []string `json:"roles_created,omitempty"`
	// Owned counts the objects handed to mefor_admin.
	Owned int `json:"objects_owned_by_admin,omitempty"`
	// OwnerSkipped says why objects were not handed to mefor_admin.
	OwnerSkipped string `json:"owner_skipped,omitempty"`
	// DatabaseClosed says this run revoked CONNECT and TEMP on the
	// database from PUBLIC (see closeBoundary).
	DatabaseClosed bool `json:"database_closed_to_public,omitempty"`
	// LocksClosed says this run revoked the advisory lock functions from
	// PUBLIC.
	LocksClosed bool `json:"advisory_locks_closed_to_public,omitempty"`
	// Unsecured lists what the migrating role could not close, each with
	// the SQL that closes it.
	Unsecured []string `json:"unsecured,omitempty"`
	// AuditSkipped says why the audit log was not handed to
	// mefor_audit_writer (see protectAudit).
	AuditSkipped string `json:"audit_skipped,omitempty"`
}

// RolesError is a step of ApplyRoles the migrating role lacks the
// privilege for, with the SQL a database administrator can run instead.
type RolesError struct {
	Step string
	SQL  string
	Err  error
}

func (e *RolesError) Error() string {
	return fmt.Sprintf("%s: %v; a superuser or a role with CREATEROLE can run 'mefor migrate' once, or run: %s", e.Step, e.Err, e.SQL)
}

func (e *RolesError) Unwrap() error { return e.Err }

// ApplyRoles creates the NOLOGIN roles mefor_reader, mefor_operator and
// mefor_admin when they do not exist (roles are shared by every database of
// the server), makes each a member of the next, and grants them what their
// commands need on mefor's and River's tables in this database. It is
// idempotent; `mefor migrate` runs it after the migrations.
//
// It then hands the tables, sequences, types and functions the migrating
// role owns to mefor_admin (after making the migrating role a member of it,
// when it is not), so that any admin can run later migrations. That needs
// mefor_admin to have CREATE on the schema, which only the schema's owner
// (usually the database owner) or a superuser can grant; without it the
// objects stay where they are, and RolesResult.OwnerSkipped says why.
//
// Creating roles and granting membership need CREATEROLE (or a superuser)
// only when something is missing: a later run by a plain owner, or by an
// admin, changes nothing at the server level.
func ApplyRoles(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*RolesResult, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for roles: %w", err)
	}
	defer conn.Release()
	res := &RolesResult{}
	if err := ensureRoles(ctx, conn.Conn(), res); err != nil {
		return nil, err
	}
	if err := ensureAuditWriter(ctx, conn.Conn(), res); err != nil {
		return nil, err
	}
	for _, r := range res.Created {
		logger.InfoContext(ctx, "created database role", "role", r)
	}
	// The migration lock serializes two migrators of this database.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) }()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var schema string
		if err := tx.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
			return fmt.Errorf("read current schema: %w", err)
		}
		if err := handOver(ctx, tx, schema, res); err != nil {
			return err
		}
		if err := grant(ctx, tx, schema); err != nil {
			return err
		}
		if err := closeBoundary(ctx, tx, res); err != nil {
			return err
		}
		return protectAudit(ctx, tx, schema, res)
	})
	if err != nil {
		return nil, err
	}
	if res.OwnerSkipped != "" {
		logger.WarnContext(ctx, "mefor_admin does not own the tables; admins can do everything except migrate",
			"reason", res.OwnerSkipped)
	}
	if res.AuditSkipped != "" {
		logger.WarnContext(ctx, "the audit log is not protected from its owner", "reason", res.AuditSkipped)
	}
	return res, nil
}

// ensureRoles creates the missing roles and memberships. Other databases'
// migrators may do the same at the same moment: a role or membership that
// appears meanwhile is fine.
func ensureRoles(ctx context.Context, conn *pgx.Conn, res *RolesResult) error {
	for _, r := range Roles {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", r).Scan(&exists); err != nil {
			return fmt.Errorf("look up role %s: %w", r, err)
		}
		if exists {
			continue
		}
		_, err := conn.Exec(ctx, "CREATE ROLE "+r+" NOLOGIN")
		switch {
		case err == nil:
			res.Created = append(res.Created, r)
		case sqlState(err, codeDuplicateObject, codeUniqueViolation):
			// Created by another migrator just now.
		case IsPermissionDenied(err):
			return &RolesError{Step: "create role " + r, Err: err, SQL: createRolesSQL()}
		default:
			return fmt.Errorf("create role %s: %w", r, err)
		}
	}
	for i := 1; i < len(Roles); i++ {
		member, role := Roles[i], Roles[i-1]
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_has_role($1, $2, 'MEMBER')", member, role).Scan(&ok); err != nil {
			return fmt.Errorf("look up membership of %s in %s: %w", member, role, err)
		}
		if ok {
			continue
		}
		err := retryConcurrent(func() error { _, err := conn.Exec(ctx, "GRANT "+role+" TO "+member); return err })
		if IsPermissionDenied(err) {
			return &RolesError{Step: "grant " + role + " to " + member, Err: err, SQL: createRolesSQL()}
		}
		if err != nil {
			return fmt.Errorf("grant %s to %s: %w", role, member, err)
		}
	}
	return nil
}

func createRolesSQL() string {
	var b strings.Builder
	for _, r := range Roles {
		fmt.Fprintf(&b, "CREATE ROLE %s NOLOGIN; ", r)
	}
	fmt.Fprintf(&b, "GRANT %s TO %s; GRANT %s TO %s;", RoleReader, RoleOperator, RoleOperator, RoleAdmin)
	return b.String()
}

// retryConcurrent runs fn again when PostgreSQL reports that another
// session changed the same catalog row at the same moment (a GRANT of one
// membership from two databases at once).
func retryConcurrent(fn func() error) error {
	var err error
	for range 5 {
		if err = fn(); err == nil || !isConcurrentCatalogUpdate(err) {
			return err
		}
	}
	return err
}

// ownedObjects lists mefor's and River's objects in schema that the
// current role may hand over (it owns them directly, or is a superuser) and
// mefor_admin does not own yet, as ALTER statements.
const ownedObjects = `
	WITH me AS (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
	objs AS (
		SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END
				|| ' ' || quote_ident(c.relname) AS obj, c.relowner AS owner
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
		  AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%')
		  -- sequences owned by a table move with it
		  AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')))
		UNION ALL
		SELECT 'FUNCTION ' || p.oid::regprocedure::text, p.proowner
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND (p.proname LIKE 'mefor\_%' OR p.proname LIKE 'river\_%')
		UNION ALL
		SELECT 'TYPE ' || t.oid::regtype::text, t.typowner
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE n.nspname = $1 AND t.typtype IN ('e', 'd') AND (t.typname LIKE 'mefor\_%' OR t.typname LIKE 'river\_%')
	)
	SELECT obj FROM objs, me
	WHERE owner <> (SELECT oid FROM pg_roles WHERE rolname = '` + RoleAdmin + `')
	  AND (me.rolsuper OR owner = (SELECT oid FROM pg_roles WHERE rolname = current_user))
	ORDER BY obj`

// handOver makes mefor_admin the owner of the objects the current role
// owns, or records in res why it cannot.
func handOver(ctx context.Context, tx pgx.Tx, schema string, res *RolesResult) error {
	var super, member bool
	if err := tx.QueryRow(ctx, `SELECT rolsuper, pg_has_role(current_user, $1, 'MEMBER') FROM pg_roles WHERE rolname = current_user`,
		RoleAdmin).Scan(&super, &member); err != nil {
		return fmt.Errorf("look up the current role: %w", err)
	}
	var canCreate bool
	if err := tx.QueryRow(ctx, `SELECT has_schema_privilege($1, $2, 'CREATE')`, RoleAdmin, schema).Scan(&canCreate); err != nil {
		return fmt.Errorf("look up %s's privileges on schema %s: %w", RoleAdmin, schema, err)
	}
	ok, err := savepoint(ctx, tx, func() error {
		if !super && !member {
			// ALTER ... OWNER TO needs membership in the new owner.
			if _, err := tx.Exec(ctx, "GRANT "+RoleAdmin+" TO CURRENT_USER"); err != nil {
				return err
			}
		}
		if canCreate {
			return nil
		}
		_, err := tx.Exec(ctx, "GRANT USAGE, CREATE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+RoleAdmin)
		return err
	})
	if err != nil {
		return err
	}
	if !ok {
		res.OwnerSkipped = fmt.Sprintf("the migrating role cannot give %s CREATE on schema %s (only the schema's owner or a superuser can), "+
			"or cannot join %s; run 'mefor migrate' once as the database owner or a superuser", RoleAdmin, schema, RoleAdmin)
		return nil
	}
	objs, err := dbpool.Column[string](ctx, tx, "list objects to hand to "+RoleAdmin, ownedObjects, schema)
	if err != nil {
		return err
	}
	objs = slices.DeleteFunc(objs, isAuditObject) // the audit writer's (roles_audit.go)
	for _, o := range objs {
		if _, err := tx.Exec(ctx, "ALTER "+o+" OWNER TO "+RoleAdmin); err != nil {
			return fmt.Errorf("hand %s to %s: %w", o, RoleAdmin, err)
		}
	}
	res.Owned = len(objs)
	return nil
}

// savepoint runs fn under a savepoint; a refusal for lack of privilege
// rolls back to it and reports false.
func savepoint(ctx context.Context, tx pgx.Tx, fn func() error) (bool, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, err
	}
	if err := fn(); err != nil {
		_ = sp.Rollback(ctx)
		if IsPermissionDenied(err) || sqlState(err, codeInvalidGrantOperation) {
			return false, nil
		}
		return false, err
	}
	return true, sp.Commit(ctx)
}

// grant gives each role what its commands need on the tables of schema.
// Grants a role already has are no-ops; the reader's SELECT on content
// tables is revoked and given again column by column, so a content column
// can never stay readable through a table-level grant.
func grant(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, err := tx.Query(ctx, `
		SELECT c.relname, array_agg(a.attname::text ORDER BY a.attnum)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v')
		  AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%')
		GROUP BY c.relname ORDER BY c.relname`, schema)
	if err != nil {
		return fmt.Errorf("list tables to grant on: %w", err)
	}
	type table struct {
		name string
		cols []string
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var t table
		err := r.Scan(&t.name, &t.cols)
		return t, err
	})
	if err != nil {
		return fmt.Errorf("list tables to grant on: %w", err)
	}
	seqs, err := dbpool.Column[string](ctx, tx, "list sequences to grant on", `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'S' AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%')
		ORDER BY c.relname`, schema)
	if err != nil {
		return err
	}
	stmts := []string{"GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + RoleReader}
	for _, sq := range seqs {
		// Operators draw nothing themselves (the write functions do, as
		// their owner): an operator's setval of mefor_work_seq would put
		// rows ahead of a lane's committed ones.
		id := pgx.Identifier{sq}.Sanitize()
		if credentialSequence(sq) {
			stmts = append(stmts, "REVOKE ALL ON SEQUENCE "+id+" FROM "+RoleReader+", "+RoleOperator,
				"GRANT ALL ON SEQUENCE "+id+" TO "+RoleAdmin)
			continue
		}
		stmts = append(stmts, "REVOKE USAGE, UPDATE ON SEQUENCE "+id+" FROM "+RoleReader+", "+RoleOperator,
			"GRANT SELECT ON SEQUENCE "+id+" TO "+RoleOperator,
			"GRANT ALL ON SEQUENCE "+id+" TO "+RoleAdmin)
	}
	for _, t := range tables {
		id := pgx.Identifier{t.name}.Sanitize()
		if slices.Contains(credentialTables, t.name) {
			// REVOKE as well: a grant made by hand, or by an older
			// release's table-wide grants, must not survive a migrate.
			stmts = append(stmts, "REVOKE ALL ON "+id+" FROM "+RoleReader+", "+RoleOperator,
				"GRANT ALL ON "+id+" TO "+RoleAdmin)
			continue
		}
		if content := readerExcluded(t.name); len(content) > 0 {
			var cols []string
			for _, c := range t.cols {
				if !slices.Contains(content, c) {
					cols = append(cols, pgx.Identifier{c}.Sanitize())
				}
			}
			stmts = append(stmts, "REVOKE SELECT ON "+id+" FROM "+RoleReader,
				"GRANT SELECT ("+strings.Join(cols, ", ")+") ON "+id+" TO "+RoleReader)
		} else {
			stmts = append(stmts, "GRANT SELECT ON "+id+" TO "+RoleReader)
		}
		if hidden := operatorHiddenColumns[t.name]; len(hidden) > 0 {
			var cols []string
			for _, c := range t.cols {
				if !slices.Contains(hidden, c) {
					cols = append(cols, pgx.Identifier{c}.Sanitize())
				}
			}
			stmts = append(stmts, "REVOKE SELECT ON "+id+" FROM "+RoleOperator,
				"GRANT SELECT ("+strings.Join(cols, ", ")+") ON "+id+" TO "+RoleOperator)
		} else {
			stmts = append(stmts, "GRANT SELECT ON "+id+" TO "+RoleOperator)
		}
		if slices.Contains(auditTables, t.name) {
			// Appended only through the writer's functions (roles_audit.go).
			stmts = append(stmts, auditGrants(t.name)...)
		} else {
			stmts = append(stmts, writeRevokes(t.name)...)
			stmts = append(stmts, "GRANT ALL ON "+id+" TO "+RoleAdmin)
		}
	}
	for _, f := range append(slices.Clone(operatorReadFunctions), operatorWriteFunctions...) {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regprocedure($1) IS NOT NULL", f).Scan(&exists); err != nil {
			return fmt.Errorf("look up function %s: %w", f, err)
		}
		if exists { // a database migrated only part of the way has none
			stmts = append(stmts, "REVOKE EXECUTE ON FUNCTION "+f+" FROM PUBLIC", "GRANT EXECUTE ON FUNCTION "+f+" TO "+RoleOperator)
		}
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			if IsPermissionDenied(err) {
				return &RolesError{Step: "grant privileges to mefor's roles", Err: err,
					SQL: "(as the owner of mefor's tables) mefor migrate"}
			}
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// RequireRole refuses, the way the database refuses a statement (SQLSTATE
// 42501), an action of the current session's role when it is not a member
// of role: for actions the table privileges alone cannot tell apart (an
// operator may insert River jobs to wake lanes, but a maintenance run is
// for admins). A database whose roles were never set up refuses nothing.
func RequireRole(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, role, action string) error {
	var ok bool
	err := q.QueryRow(ctx, `
		SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) OR pg_has_role(current_user, $1, 'USAGE')`,
		role).Scan(&ok)
	if err != nil {
		return fmt.Errorf("check role %s: %w", role, err)
	}
	if !ok {
		return permissionDenied(action + " is for members of " + role)
	}
	return nil
}
