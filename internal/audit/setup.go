package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// WriterRole owns mefor_audit, mefor_audit_anchor and the functions that
// append to them, and does nothing else: no login is a member of it, and
// no other role may write either table (`mefor migrate` sets this up).
const WriterRole = "mefor_audit_writer"

// setupChecks are the ways the log's protection can be undone, each a query
// listing what is wrong, one line per finding.
var setupChecks = []string{
	// The tables and the definer functions belong to the writer role.
	`SELECT format('table %s is owned by %s, not ` + WriterRole + `', c.relname, pg_get_userbyid(c.relowner))
	 FROM pg_class c WHERE c.oid IN ('mefor_audit'::regclass, 'mefor_audit_anchor'::regclass)
	   AND pg_get_userbyid(c.relowner) <> '` + WriterRole + `'`,
	`SELECT format('function %s is owned by %s, not ` + WriterRole + `', p.oid::regprocedure, pg_get_userbyid(p.proowner))
	 FROM pg_proc p WHERE p.proname IN ('mefor_audit_append', 'mefor_audit_anchor_add')
	   AND pg_get_userbyid(p.proowner) <> '` + WriterRole + `'`,
	`SELECT format('function %s is not SECURITY DEFINER with a fixed search_path', p.oid::regprocedure)
	 FROM pg_proc p WHERE p.proname IN ('mefor_audit_append', 'mefor_audit_anchor_add')
	   AND NOT (p.prosecdef AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search\_path=%'))`,
	// Nobody else may write the tables directly (superusers always can;
	// that is what the audit key is for).
	`SELECT format('role %s may %s %s directly', r.rolname, priv, t)
	 FROM pg_roles r, unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) priv,
	      unnest(ARRAY['mefor_audit', 'mefor_audit_anchor']) t
	 WHERE NOT r.rolsuper AND r.rolname <> '` + WriterRole + `' AND r.rolname NOT LIKE 'pg\_%'
	   AND has_table_privilege(r.oid, t, priv)
	 ORDER BY 1`,
	// Nobody may act as the writer.
	`SELECT format('role %s is a member of ` + WriterRole + `', pg_get_userbyid(m.member))
	 FROM pg_auth_members m WHERE m.roleid = (SELECT oid FROM pg_roles WHERE rolname = '` + WriterRole + `')`,
}

// CheckSetup lists what is wrong with who may write the audit log. A
// database whose roles were never set up (`mefor migrate` grants
// mefor_reader EXECUTE on mefor_audit_append) lists nothing and says so in
// note: every login may do everything there.
func CheckSetup(ctx context.Context, q DBTX) (problems []string, note string, err error) {
	var setUp bool
	err = q.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)
		   AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mefor_reader')
		   AND to_regprocedure('mefor_audit_append(text, text, text, text, text, text)') IS NOT NULL
		   AND has_function_privilege('mefor_reader', 'mefor_audit_append(text, text, text, text, text, text)', 'EXECUTE')`,
		WriterRole).Scan(&setUp)
	if err != nil {
		return nil, "", fmt.Errorf("check the audit log's setup: %w", err)
	}
	if !setUp {
		return nil, "the database roles were never set up here: run 'mefor migrate'", nil
	}
	for _, c := range setupChecks {
		found, err := dbpool.Rows(ctx, q, "check the audit log's setup", pgx.RowTo[string], c)
		if err != nil {
			return nil, "", err
		}
		problems = append(problems, found...)
	}
	return problems, "", nil
}
