-- Operators read message bodies, delivery payloads, partner replies and
-- reference values only through functions that write the audit row
-- themselves (issue 49): they hold no SELECT on mefor_message.raw,
-- mefor_work.payload, mefor_response.body or mefor_reference_row.value
-- (migrations/roles.go).
--
-- The functions are SECURITY DEFINER, owned by mefor_admin (`mefor
-- migrate` hands every mefor_* function to it), which reads every column
-- anyway: running as it gives a caller nothing but what each function
-- returns. Each resolves names only in mefor's schema, then pg_temp, last.

-- mefor_read_body returns a message's body, its partner replies and its
-- deliveries' payloads, as stored (sealed values stay sealed: the keys
-- never reach the database), and appends the view-body audit row in the
-- caller's transaction, naming p_actor (the mefor user, through the API)
-- when it is not empty. Call it last in the transaction: the audit row's
-- lock is then held only until the commit.
CREATE FUNCTION mefor_read_body(p_message_id bigint, p_os_user text, p_host text, p_actor text)
RETURNS TABLE (kind text, row_id bigint, body bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n_replies bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mefor_message m WHERE m.id = p_message_id) THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n_replies FROM mefor_response r WHERE r.message_id = p_message_id;
    RETURN QUERY SELECT 'message'::text, m.id, m.raw FROM mefor_message m WHERE m.id = p_message_id;
    RETURN QUERY SELECT 'reply'::text, r.id, r.body FROM mefor_response r WHERE r.message_id = p_message_id ORDER BY r.id;
    RETURN QUERY SELECT 'outbound'::text, w.id, w.payload FROM mefor_work w
        WHERE w.message_id = p_message_id AND w.stage = 'outbound' ORDER BY w.id;
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'view-body',
        (jsonb_build_object('message_id', p_message_id, 'replies', n_replies)
            || CASE WHEN p_actor <> '' THEN jsonb_build_object('actor', p_actor) ELSE '{}'::jsonb END)::text, 'ok');
END $$;

-- mefor_key_census counts the values of every sealed column by the key id
-- of their envelope ('' for plaintext, '?' for a damaged one), for `mefor
-- keys status`: key ids are metadata, the values are not returned. It
-- follows internal/rotation's SealedColumns; TestKeyCensusFunctionAgrees
-- checks the two agree.
CREATE FUNCTION mefor_key_census()
RETURNS TABLE (column_name text, key_id text, n bigint)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c record;
    expr text;
    cond text;
BEGIN
    FOR c IN SELECT * FROM (VALUES
        ('mefor_message', 'raw', 'bytes', NULL),
        ('mefor_message', 'patient_key', 'blind', NULL),
        ('mefor_work', 'payload', 'bytes', NULL),
        ('mefor_response', 'body', 'bytes', NULL),
        ('mefor_state', 'value', 'bytes', NULL),
        ('mefor_state', 'key', 'blind', NULL),
        ('mefor_reference_row', 'value', 'json', NULL),
        ('mefor_message', 'error', 'text', NULL),
        ('mefor_work', 'last_error', 'text', NULL),
        ('mefor_event', 'detail', 'text', 'event IN (''failed'', ''dead'', ''replied'')')
    ) AS v(tbl, col, kind, only_if) LOOP
        expr := CASE c.kind
            WHEN 'bytes' THEN format($f$CASE WHEN substring(%1$I FOR 4) = '\x006d6665'::bytea THEN
                CASE WHEN length(%1$I) > 5 THEN encode(substring(%1$I FROM 7 FOR get_byte(%1$I, 5)), 'escape') ELSE '?' END END$f$, c.col)
            WHEN 'text' THEN format($f$substring(%1$I FROM 'mfe[12]:([^:]*):')$f$, c.col)
            WHEN 'json' THEN format($f$CASE WHEN jsonb_typeof(%1$I) = 'string' THEN substring(%1$I #>> '{}' FROM '^mfe[12]:([^:]*):') END$f$, c.col)
            ELSE format($f$CASE WHEN left(%1$I, 4) = 'bi1:' THEN split_part(substr(%1$I, 5), ':', 1) END$f$, c.col)
        END;
        cond := format('%I IS NOT NULL', c.col);
        IF c.kind IN ('text', 'blind') THEN
            cond := cond || format(' AND %I <> ''''', c.col);
        END IF;
        IF c.only_if IS NOT NULL THEN
            cond := cond || ' AND ' || c.only_if;
        END IF;
        RETURN QUERY EXECUTE format('SELECT %L::text, coalesce(%s, ''''), count(*) FROM %I WHERE %s GROUP BY 2 ORDER BY 2',
            c.tbl || '.' || c.col, expr, c.tbl, cond);
    END LOOP;
END $$;

-- mefor_search_bodies returns, of the messages p_ids (one page of a
-- `messages list --text` search, chosen by their metadata), those whose
-- stored body holds p_text in clear and every sealed one (mefor opens and
-- matches those; the keys never reach the database), and appends a
-- search-bodies audit row naming the messages whose bodies it returned,
-- never the text. Each page is its own short transaction, so the audit
-- log's lock is held only until its commit.
CREATE FUNCTION mefor_search_bodies(p_ids bigint[], p_text bytea, p_os_user text, p_host text, p_target text)
RETURNS TABLE (message_id bigint, raw bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    read_ids bigint[];
BEGIN
    IF p_target IS NULL OR jsonb_typeof(p_target::jsonb) <> 'object' THEN
        RAISE EXCEPTION 'mefor_search_bodies: target must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_text IS NULL OR length(p_text) = 0 THEN
        RAISE EXCEPTION 'mefor_search_bodies: no text to search for' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY SELECT m.id, m.raw FROM mefor_message m
        WHERE m.id = ANY(p_ids)
          AND (position(p_text IN m.raw) > 0 OR substring(m.raw FOR 4) = '\x006d6665'::bytea)
        ORDER BY m.id DESC;
    SELECT coalesce(array_agg(m.id ORDER BY m.id DESC), '{}') INTO read_ids FROM mefor_message m
        WHERE m.id = ANY(p_ids)
          AND (position(p_text IN m.raw) > 0 OR substring(m.raw FOR 4) = '\x006d6665'::bytea);
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'search-bodies',
        (p_target::jsonb || jsonb_build_object('candidates', coalesce(cardinality(p_ids), 0), 'bodies_read', to_jsonb(read_ids)))::text,
        'ok');
END $$;

-- mefor_read_reference returns the rows of reference set p_set's live
-- snapshot (only key p_key's when it is not NULL; at most p_limit + 1 when
-- p_limit is positive, so the caller can tell there are more), values as
-- stored, and appends the view-reference audit row: the set, its version,
-- the rows shown and whether one key was asked for, never the key. A set
-- without a snapshot returns nothing and records nothing.
CREATE FUNCTION mefor_read_reference(p_set text, p_key text, p_limit integer, p_os_user text, p_host text)
RETURNS TABLE (ref_version bigint, row_key text, row_value jsonb)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v bigint;
    n bigint;
BEGIN
    SELECT s.version INTO v FROM mefor_reference_set s WHERE s.name = p_set;
    IF coalesce(v, 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT v, r.key, r.value FROM mefor_reference_row r
        WHERE r.set_name = p_set AND r.version = v AND (p_key IS NULL OR r.key = p_key)
        ORDER BY r.key
        LIMIT CASE WHEN p_limit > 0 THEN p_limit + 1 END;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF p_limit > 0 THEN
        n := least(n, p_limit);
    END IF;
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'view-reference',
        jsonb_build_object('set', p_set, 'by_key', p_key IS NOT NULL, 'version', v, 'rows', n)::text, 'ok');
END $$;

-- mefor_unbound_count counts the content values a sealed store refuses
-- because they are not sealed bound to their row (plaintext, or an envelope
-- older than mfe2), for `mefor keys status` and `keys rotate`: once it is
-- zero, rotate marks the store sealed. Counts only, never a value. It
-- follows internal/rotation's refusedColumns; the key rotation test of
-- cmd/mefor checks the two agree (rotation.UnboundDirect).
CREATE FUNCTION mefor_unbound_count()
RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT (SELECT count(*) FROM mefor_message WHERE raw IS NOT NULL AND substring(raw FOR 5) <> '\x006d666532'::bytea)
         + (SELECT count(*) FROM mefor_work WHERE payload IS NOT NULL AND substring(payload FOR 5) <> '\x006d666532'::bytea)
         + (SELECT count(*) FROM mefor_response WHERE body IS NOT NULL AND substring(body FOR 5) <> '\x006d666532'::bytea)
         + (SELECT count(*) FROM mefor_state WHERE value IS NOT NULL AND substring(value FOR 5) <> '\x006d666532'::bytea)
         + (SELECT count(*) FROM mefor_reference_row WHERE value IS NOT NULL
              AND NOT (jsonb_typeof(value) = 'string' AND left(value #>> '{}', 5) = 'mfe2:'))
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION mefor_read_body(bigint, text, text, text) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_key_census() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_unbound_count() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_search_bodies(bigint[], bytea, text, text, text) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION mefor_read_reference(text, text, integer, text, text) SET search_path = %I, pg_temp', current_schema());
END $$;
REVOKE EXECUTE ON FUNCTION mefor_read_body(bigint, text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION mefor_key_census() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION mefor_unbound_count() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION mefor_search_bodies(bigint[], bytea, text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION mefor_read_reference(text, text, integer, text, text) FROM PUBLIC;
