-- The audit log no login can break: rows are appended only by
-- mefor_audit_append, a SECURITY DEFINER function that draws seq, reads the
-- previous hash and computes the row's hash in the server under its own
-- table lock. `mefor migrate` (migrations.ApplyRoles) hands the table and
-- the functions to mefor_audit_writer, a NOLOGIN role that does nothing
-- else, and grants no role INSERT, UPDATE or DELETE on the table.
--
-- The hash is the one mefor computed in Go before this migration (the
-- same encoding, see internal/audit rowHash), so rows written before it
-- verify unchanged and the first row written by the function chains on.

-- The row now says who appended it itself: the trigger that checked a
-- client-supplied db_role is no longer needed.
DROP TRIGGER mefor_audit_check_role ON mefor_audit;
DROP FUNCTION mefor_audit_check_role();

-- One field of the hashed encoding: its length in bytes as an unsigned
-- varint, then its UTF-8 bytes (Go's binary.PutUvarint).
CREATE FUNCTION mefor_audit_field(s text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    b   bytea := convert_to(s, 'UTF8');
    n   bigint := length(b);
    out bytea := ''::bytea;
BEGIN
    LOOP
        IF n < 128 THEN
            RETURN out || set_byte('\x00'::bytea, 0, n::int) || b;
        END IF;
        out := out || set_byte('\x00'::bytea, 0, (n % 128 + 128)::int);
        n := n / 128;
    END LOOP;
END $$;

-- The row's hash: SHA-256 over its fields, each length-prefixed, ending
-- with the previous row's hash.
CREATE FUNCTION mefor_audit_row_hash(seq bigint, at timestamptz, os_user text, db_role text, host text,
    node_id text, action text, target text, outcome text, prev_hash text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(
        mefor_audit_field('mefor-audit-v1') ||
        mefor_audit_field(seq::text) ||
        mefor_audit_field(to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) ||
        mefor_audit_field(os_user) ||
        mefor_audit_field(db_role) ||
        mefor_audit_field(host) ||
        mefor_audit_field(coalesce(node_id, '')) ||
        mefor_audit_field(action) ||
        mefor_audit_field(target) ||
        mefor_audit_field(outcome) ||
        mefor_audit_field(prev_hash)), 'hex')
$$;

-- Appends one row and returns its seq. The caller says what it knows about
-- itself (OS user, host, node) and the action; the server says who it is
-- (session_user, the login that authenticated), when, and where the row
-- goes in the chain. The table lock (SHARE ROW EXCLUSIVE conflicts with
-- itself) is held to the end of the caller's transaction, so appends are
-- serialized in commit order and the chain cannot fork; only the table's
-- owner can take it, so no other login can stall the log by holding it.
CREATE FUNCTION mefor_audit_append(p_os_user text, p_host text, p_node_id text, p_action text,
    p_target text, p_outcome text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    r_seq  bigint;
    r_prev text;
    r_at   timestamptz := date_trunc('microseconds', clock_timestamp());
    r_role text := session_user::text;
BEGIN
    IF p_action IS NULL OR p_action !~ '^[a-z][a-z0-9-]{0,39}$' THEN
        RAISE EXCEPTION 'mefor_audit_append: action must be 1 to 40 lowercase letters, digits or -'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_outcome IS NULL OR length(p_outcome) NOT BETWEEN 1 AND 64
        OR length(coalesce(p_os_user, '')) > 256 OR length(coalesce(p_host, '')) > 256
        OR length(coalesce(p_node_id, '')) > 256 THEN
        RAISE EXCEPTION 'mefor_audit_append: outcome must be 1 to 64 characters, os user, host and node at most 256'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_target IS NULL OR length(p_target) > 65536 OR jsonb_typeof(p_target::jsonb) <> 'object' THEN
        RAISE EXCEPTION 'mefor_audit_append: target must be a JSON object of at most 64 KiB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOCK TABLE mefor_audit IN SHARE ROW EXCLUSIVE MODE;
    SELECT a.seq, a.hash INTO r_seq, r_prev FROM mefor_audit a ORDER BY a.seq DESC LIMIT 1;
    r_seq := coalesce(r_seq, 0) + 1;
    r_prev := coalesce(r_prev, '');
    INSERT INTO mefor_audit (seq, at, os_user, db_role, host, node_id, action, target, outcome, prev_hash, hash)
    VALUES (r_seq, r_at, coalesce(p_os_user, ''), r_role, coalesce(p_host, ''), NULLIF(p_node_id, ''),
        p_action, p_target, p_outcome, r_prev,
        mefor_audit_row_hash(r_seq, r_at, coalesce(p_os_user, ''), r_role, coalesce(p_host, ''),
            NULLIF(p_node_id, ''), p_action, p_target, p_outcome, r_prev));
    RETURN r_seq;
END $$;

-- Anchors: the chain's head at some moment (seq and hash), taken by the
-- leader's audit_anchor maintenance job. Each anchor carries an HMAC under
-- MEFOR_AUDIT_KEY (computed by mefor; the key never reaches the database)
-- over its row and the previous anchor's MAC, so a rewritten chain, a row
-- inserted or deleted before an anchor, or an anchor removed from the
-- middle is caught by `mefor audit verify` with the key; and an anchored
-- row cut off the end is caught even without it. key_id and mac are NULL
-- for an anchor taken without a key.
CREATE TABLE mefor_audit_anchor (
    no         bigint      PRIMARY KEY,
    audit_seq  bigint      NOT NULL,
    audit_hash text        NOT NULL,
    taken_at   timestamptz NOT NULL,
    node_id    text,
    key_id     text,
    prev_mac   text        NOT NULL,
    mac        text,
    CONSTRAINT mefor_audit_anchor_no_positive CHECK (no > 0)
);

-- Adds anchor number p_no over audit row p_seq. It refuses an anchor whose
-- row is not in the log with that hash, or that does not follow the latest
-- anchor (another node anchored meanwhile: the caller tries again later).
CREATE FUNCTION mefor_audit_anchor_add(p_no bigint, p_seq bigint, p_hash text, p_node_id text,
    p_key_id text, p_prev_mac text, p_mac text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    last_no  bigint;
    last_mac text;
BEGIN
    LOCK TABLE mefor_audit_anchor IN SHARE ROW EXCLUSIVE MODE;
    SELECT a.no, coalesce(a.mac, '') INTO last_no, last_mac FROM mefor_audit_anchor a ORDER BY a.no DESC LIMIT 1;
    IF p_no IS DISTINCT FROM coalesce(last_no, 0) + 1 OR p_prev_mac IS DISTINCT FROM coalesce(last_mac, '') THEN
        RAISE EXCEPTION 'mefor_audit_anchor_add: anchor % does not follow the latest anchor %', p_no, coalesce(last_no, 0)
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM mefor_audit a WHERE a.seq = p_seq AND a.hash = p_hash) THEN
        RAISE EXCEPTION 'mefor_audit_anchor_add: audit row % with that hash is not in the log', p_seq
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(coalesce(p_node_id, '')) > 256 OR length(coalesce(p_key_id, '')) > 64 OR length(coalesce(p_mac, '')) > 128 THEN
        RAISE EXCEPTION 'mefor_audit_anchor_add: node, key id or mac too long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO mefor_audit_anchor (no, audit_seq, audit_hash, taken_at, node_id, key_id, prev_mac, mac)
    VALUES (p_no, p_seq, p_hash, clock_timestamp(), NULLIF(p_node_id, ''), NULLIF(p_key_id, ''), p_prev_mac, NULLIF(p_mac, ''));
END $$;

-- A definer function resolves names only in mefor's schema (then pg_temp,
-- last, so nobody's temporary table can stand in for mefor_audit).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION mefor_audit_append(text, text, text, text, text, text) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_audit_anchor_add(bigint, bigint, text, text, text, text, text) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_audit_row_hash(bigint, timestamptz, text, text, text, text, text, text, text, text) SET search_path = %I, pg_temp', current_schema());
END $$;
REVOKE EXECUTE ON FUNCTION mefor_audit_append(text, text, text, text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION mefor_audit_anchor_add(bigint, bigint, text, text, text, text, text) FROM PUBLIC;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON mefor_audit FROM PUBLIC;

-- Appends lock the audit table inside mefor_audit_append, so the advisory
-- audit lock of migration 018 is no longer taken by anyone.
DROP FUNCTION IF EXISTS mefor_audit_lock();
