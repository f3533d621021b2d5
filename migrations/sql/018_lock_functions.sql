-- The audit log's lock, taken through a function so that readers, whose
-- refused attempts are audited, need no EXECUTE on PostgreSQL's advisory
-- lock functions: `mefor migrate` revokes those from PUBLIC (see
-- migrations/roles.go, closeAdvisoryLocks). The key is audit.lockClass.
CREATE OR REPLACE FUNCTION mefor_audit_lock() RETURNS void
	LANGUAGE sql VOLATILE SECURITY DEFINER
	SET search_path = pg_catalog, pg_temp
	AS $$ SELECT pg_advisory_xact_lock(28001, 0) $$;

REVOKE EXECUTE ON FUNCTION mefor_audit_lock() FROM PUBLIC;
