-- Operators change the pipeline only through functions (issue 49): replay,
-- replay-dead, cancel, the cancel of marked rows whose drainer stopped, and
-- enqueue. mefor_operator holds no INSERT, UPDATE or DELETE on any pipeline
-- table, River's river_job or mefor_lane (migrations/roles.go), so its own
-- statements cannot re-queue, cancel, rewrite or insert anything, nor add
-- a drainer job; and each function appends its audit row itself, in the
-- caller's transaction, so no operator write commits unaudited.
--
-- The functions are SECURITY DEFINER, owned by mefor_admin (`mefor
-- migrate` hands every mefor_* function to it), and resolve names only in
-- mefor's schema, then pg_temp. The helpers they call (lane locks, drainer
-- activation, wake-up, finalize, cancel) run as their caller, which is the
-- owner inside a definer function; nobody else may execute them.
--
-- Statements that name their rows by id compare status with (SELECT
-- 'pending'), as pipeline.PendingByID does and for its reason: statistics
-- taken while nothing was pending must not make them walk a backlog.
--
-- Each function keeps the lock order of every pipeline path (see
-- internal/pipeline/doc.go): drainers' river_job rows (cancel only), then
-- lane locks sorted by name, then work rows in id order, then the
-- messages' finalize locks in id order. The lane and finalize lock keys
-- are jobs.LaneLock's and the finalizer's (TestLaneKeysAgreeWithGo checks
-- the SQL and the Go agree).

-- mefor_lane_key is jobs.laneLockKey: FNV-32a of the lane name's bytes,
-- as a signed int4.
CREATE FUNCTION mefor_lane_key(p_lane text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    b bytea := convert_to(p_lane, 'UTF8');
    h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN (CASE WHEN h >= 2147483648 THEN h - 4294967296 ELSE h END)::integer;
END $$;

-- mefor_lock_lanes takes the lanes' transaction locks (class 0x6d66) in
-- name order, bytewise as Go sorts them, one after the other.
CREATE FUNCTION mefor_lock_lanes(p_lanes text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l text;
BEGIN
    FOR l IN SELECT DISTINCT x COLLATE "C" FROM unnest(p_lanes) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(28006, mefor_lane_key(l));
    END LOOP;
END $$;

-- mefor_lock_messages takes the finalize locks (class 0x6d6d, the id's low
-- 32 bits as a signed int4) of messages in id order.
CREATE FUNCTION mefor_lock_messages(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m bigint;
    k bigint;
BEGIN
    FOR m IN SELECT DISTINCT x FROM unnest(p_ids) AS x ORDER BY 1 LOOP
        k := m & 4294967295;
        PERFORM pg_advisory_xact_lock(28013, (CASE WHEN k >= 2147483648 THEN k - 4294967296 ELSE k END)::integer);
    END LOOP;
END $$;

-- mefor_finalize is pipeline.FinalizeMany: the messages' finalize locks,
-- then, in a statement of its own (a snapshot taken after the locks), the
-- status derived from all their rows. Keep it in step with finalizeSQL
-- in internal/pipeline/finalize.go.
CREATE FUNCTION mefor_finalize(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mefor_lock_messages(p_ids);
    WITH r AS (
        SELECT message_id,
            bool_or(status = 'pending')  AS any_pending,
            bool_or(status = 'dead')     AS any_dead,
            bool_or(stage = 'outbound')  AS any_outbound,
            min(last_error) FILTER (WHERE status = 'dead') AS dead_reason
        FROM mefor_work WHERE message_id = ANY(p_ids)
        GROUP BY message_id
    )
    UPDATE mefor_message m SET
        status = CASE
            WHEN r.any_dead THEN 'error'
            WHEN r.any_outbound THEN 'processed'
            ELSE 'filtered'
        END,
        error = CASE WHEN r.any_dead THEN 'dead-lettered: ' || coalesce(r.dead_reason, 'unknown reason') ELSE m.error END,
        updated_at = clock_timestamp()
    FROM r
    WHERE m.id = r.message_id
      AND NOT r.any_pending
      AND (r.any_dead OR r.any_outbound OR m.status = 'routed');
END $$;

-- mefor_notify_queues is jobs.NotifyQueues: River's insert notification
-- for each queue, sent at commit, so every node's producers fetch.
CREATE FUNCTION mefor_notify_queues(p_queues text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT count(pg_notify(current_schema() || '.river_insert', '{"queue": "' || q || '"}'))
    FROM (SELECT DISTINCT q FROM unnest(p_queues) AS q WHERE q IS NOT NULL) s
$$;

-- mefor_activate_lanes is jobs.Activate: every lane of p_lanes without a
-- live drainer gets one, inserted as River's InsertManyTx inserts the
-- drainer kinds of package jobs (args {"lane": ...}, unique by args among
-- the live states, so unique_key is sha256 of '&kind=<kind>&args=<args>'
-- and unique_states the bitmask of available, pending, retryable, running
-- and scheduled; queue and kind mefor_<stage>; max_attempts 25; priority
-- 1), with River's ON CONFLICT, so a drainer River inserted meanwhile is
-- found instead of doubled; recorded in mefor_lane and announced at
-- commit. The caller holds the lanes' locks. A name that is not a lane
-- (its stage, then a config name, as jobs names them) is refused: its
-- JSON would need escaping, and it drains nothing.
-- TestSQLActivationIsRiversUniqueInsert (jobs) checks River agrees.
CREATE FUNCTION mefor_activate_lanes(p_lanes text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    dead text[];
    queues text[];
BEGIN
    SELECT array_agg(n.name ORDER BY n.name COLLATE "C") INTO dead
    FROM (SELECT DISTINCT x AS name FROM unnest(p_lanes) AS x) n
    LEFT JOIN mefor_lane l ON l.name = n.name
    LEFT JOIN river_job j ON j.id = l.job_id
    WHERE j.id IS NULL OR NOT (j.state::text = ANY(ARRAY['available', 'pending', 'running', 'retryable', 'scheduled']));
    IF dead IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(dead) AS d
               WHERE d !~ '^(ingress|routed):[a-z0-9][a-z0-9_.-]*$'
                 AND d !~ '^outbound:[a-z0-9][a-z0-9_.-]*(~[0-9]+)?(#[0-9]+)?$') THEN
        RAISE EXCEPTION 'mefor_activate_lanes: not a lane name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH k AS (
        SELECT d AS lane, 'mefor_' || split_part(d, ':', 1) AS kind, n
        FROM unnest(dead) WITH ORDINALITY AS u(d, n)
    ), j AS (
        INSERT INTO river_job (args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state,
            tags, unique_key, unique_states)
        SELECT jsonb_build_object('lane', lane), now(), kind, 25, '{}'::jsonb, 1, kind, now(), 'available',
            '{}'::varchar(255)[],
            sha256(convert_to('&kind=' || kind || '&args={"lane":"' || lane || '"}', 'UTF8')),
            B'11110001'
        FROM k ORDER BY n
        ON CONFLICT (unique_key)
            WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL
              AND river_job_state_in_bitmask(unique_states, state)
            DO UPDATE SET kind = river_job.kind
        RETURNING id, args ->> 'lane' AS lane, queue, xmax = 0 AS inserted
    ), r AS (
        INSERT INTO mefor_lane (name, stage, job_id, activated_at)
        SELECT j.lane, split_part(j.lane, ':', 1), j.id, clock_timestamp() FROM j
        ON CONFLICT (name) DO UPDATE SET job_id = EXCLUDED.job_id, activated_at = EXCLUDED.activated_at
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE inserted) INTO queues FROM j;
    PERFORM mefor_notify_queues(queues);
END $$;

-- mefor_wake_lanes is ops.wake: the lanes' snoozed drainers (locked in id
-- order) made available now, as River's JobRetryTx does, and announced.
CREATE FUNCTION mefor_wake_lanes(p_lanes text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    queues text[];
BEGIN
    IF coalesce(cardinality(p_lanes), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(s.id) INTO ids FROM (
        SELECT j.id FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
        WHERE l.name = ANY(p_lanes) AND j.state = 'scheduled'
        ORDER BY j.id
        FOR UPDATE OF j
    ) s;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    WITH u AS (
        UPDATE river_job SET state = 'available',
            max_attempts = CASE WHEN attempt = max_attempts THEN max_attempts + 1 ELSE max_attempts END,
            finalized_at = NULL,
            metadata = metadata - 'cancel_attempted_at',
            scheduled_at = now()
        WHERE id = ANY(ids) AND state = 'scheduled'
        RETURNING queue
    )
    SELECT array_agg(queue) INTO queues FROM u;
    PERFORM mefor_notify_queues(queues);
END $$;

-- mefor_requeue is pipeline's requeue: rows of p_ids in one of p_from
-- back to pending at the back of their lanes (a fresh seq each, in lane
-- order), attempts reset, due now; a row whose body was purged is left.
-- The caller holds the lanes' locks.
CREATE FUNCTION mefor_requeue(p_ids bigint[], p_from text[])
RETURNS TABLE (work_id bigint, message_id bigint, lane text, destination text)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH locked AS (
        SELECT w.id, w.lane, w.seq FROM mefor_work w
        WHERE w.id = ANY(p_ids) AND w.status = ANY(p_from)
          AND NOT EXISTS (SELECT 1 FROM mefor_message m WHERE m.id = w.message_id AND m.body_purged_at IS NOT NULL)
        FOR UPDATE OF w
    ), pick AS (
        SELECT locked.id, row_number() OVER (ORDER BY locked.lane COLLATE "C", locked.seq, locked.id) AS rn FROM locked
    ), fresh AS (
        SELECT v, row_number() OVER (ORDER BY v) AS rn
        FROM (SELECT nextval('mefor_work_seq') AS v FROM locked) s
    )
    UPDATE mefor_work w SET status = 'pending', seq = fresh.v, attempts = 0, last_error = NULL,
        next_attempt_at = clock_timestamp(), updated_at = clock_timestamp(), finished_at = NULL,
        cancel_requested_at = NULL
    FROM pick JOIN fresh USING (rn)
    WHERE w.id = pick.id
    RETURNING w.id, w.message_id, w.lane, coalesce(w.destination, '');
END $$;

-- mefor_cancel_work is pipeline's cancelRows: those of p_ids still pending
-- cancelled (locked in id order), a cancelled event each, their messages
-- finalized. The caller holds their lanes' locks.
CREATE FUNCTION mefor_cancel_work(p_ids bigint[], OUT n_rows integer, OUT n_messages integer, OUT lanes text[])
LANGUAGE plpgsql AS $$
DECLARE
    msgs bigint[];
BEGIN
    n_rows := 0;
    n_messages := 0;
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    WITH c AS (
        SELECT id FROM mefor_work WHERE id = ANY(p_ids) AND status = (SELECT 'pending') ORDER BY id FOR UPDATE
    ), w AS (
        UPDATE mefor_work w SET status = 'cancelled', updated_at = clock_timestamp(), finished_at = clock_timestamp()
        FROM c WHERE w.id = c.id
        RETURNING w.id, w.message_id, w.lane, w.destination
    ), e AS (
        INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
        SELECT w.message_id, 'cancelled', w.id, w.destination, 'cancelled by operator' FROM w
    )
    SELECT count(*), array_agg(w.message_id), array_agg(DISTINCT w.lane) INTO n_rows, msgs, lanes FROM w;
    IF n_rows = 0 THEN
        lanes := NULL;
        RETURN;
    END IF;
    PERFORM mefor_finalize(msgs);
    SELECT count(DISTINCT x) INTO n_messages FROM unnest(msgs) AS x;
END $$;

-- mefor_lock_drainers is jobs.LockDrainers: the lanes' drainer job rows
-- locked in id order; returns the lanes whose drainer is running.
CREATE FUNCTION mefor_lock_drainers(p_lanes text[]) RETURNS text[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(s.name) FILTER (WHERE s.running), '{}') FROM (
        SELECT l.name, j.state = 'running' AS running
        FROM mefor_lane l JOIN river_job j ON j.id = l.job_id
        WHERE l.name = ANY(p_lanes)
        ORDER BY j.id
        FOR UPDATE OF j
    ) s
$$;

-- mefor_op_target is the caller's audit target (a JSON object, with the
-- actor when a person acted) with what the function did merged in.
CREATE FUNCTION mefor_op_target(p_target text, p_done jsonb) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_target IS NULL OR p_target = '' THEN
        p_target := '{}';
    END IF;
    IF jsonb_typeof(p_target::jsonb) <> 'object' THEN
        RAISE EXCEPTION 'audit target must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (p_target::jsonb || p_done)::text;
END $$;

-- mefor_replay is pipeline.ReplayMessage and ops.Replay: a message's dead
-- and pending rows re-queued (pending rows keep their place, dead ones go
-- to the back), or else its delivered outbound rows re-sent at the back;
-- lanes activated, the message back to received or routed with a replayed
-- event, the snoozed drainers of lanes whose waiting head is now due woken,
-- and the replay audit row appended last. Raises MF404 for an unknown
-- message, MF410 when retention purged its body.
CREATE FUNCTION mefor_replay(p_message_id bigint, p_os_user text, p_host text, p_target text)
RETURNS TABLE (mode text, n_rows integer, status text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    st text;
    purged boolean;
    md text := 'recover';
    ids bigint[];
    lanes text[];
    pending bigint[];
    dead bigint[];
    n integer := 0;
    k integer;
    expedited text[];
BEGIN
    SELECT m.status, m.body_purged_at IS NOT NULL INTO st, purged FROM mefor_message m WHERE m.id = p_message_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'message % not found', p_message_id USING ERRCODE = 'MF404';
    END IF;
    SELECT array_agg(w.id ORDER BY w.id), array_agg(w.lane ORDER BY w.id),
        array_agg(w.id ORDER BY w.id) FILTER (WHERE w.status = 'pending'),
        array_agg(w.id ORDER BY w.id) FILTER (WHERE w.status <> 'pending')
        INTO ids, lanes, pending, dead
    FROM mefor_work w WHERE w.message_id = p_message_id AND w.status IN ('dead', 'pending');
    IF ids IS NULL THEN
        md := 'resend';
        SELECT array_agg(w.id ORDER BY w.id), array_agg(w.lane ORDER BY w.id), array_agg(w.id ORDER BY w.id)
            INTO ids, lanes, dead
        FROM mefor_work w WHERE w.message_id = p_message_id AND w.status = 'done' AND w.stage = 'outbound';
    END IF;
    IF ids IS NOT NULL THEN
        IF purged THEN
            RAISE EXCEPTION 'message %: body was purged by retention', p_message_id USING ERRCODE = 'MF410';
        END IF;
        PERFORM mefor_lock_lanes(lanes);
        PERFORM 1 FROM mefor_work w WHERE w.id = ANY(ids) ORDER BY w.id FOR UPDATE;
        PERFORM mefor_lock_messages(ARRAY[p_message_id]);
        -- Retention takes the same row and finalize locks: under them the
        -- answer is final.
        SELECT m.body_purged_at IS NOT NULL INTO purged FROM mefor_message m WHERE m.id = p_message_id;
        IF purged THEN
            RAISE EXCEPTION 'message %: body was purged by retention', p_message_id USING ERRCODE = 'MF410';
        END IF;
        -- Pending rows: reset in place, each re-checked under its lock.
        WITH old AS (
            SELECT w.id, w.next_attempt_at > clock_timestamp() AS waiting
            FROM mefor_work w WHERE w.id = ANY(pending) AND w.status = (SELECT 'pending')
            FOR UPDATE
        ), u AS (
            UPDATE mefor_work w SET attempts = 0, last_error = NULL, next_attempt_at = clock_timestamp(),
                updated_at = clock_timestamp()
            FROM old WHERE w.id = old.id
            RETURNING w.lane, old.waiting
        )
        SELECT count(*), array_agg(DISTINCT u.lane) FILTER (WHERE u.waiting) INTO n, expedited FROM u;
        SELECT count(*) INTO k FROM mefor_requeue(dead, CASE WHEN md = 'resend' THEN ARRAY['done'] ELSE ARRAY['dead'] END);
        n := n + k;
    END IF;
    IF n = 0 THEN
        -- Nothing to replay, or every candidate changed under us.
        md := '';
    ELSE
        PERFORM mefor_activate_lanes(lanes);
        UPDATE mefor_message m SET
            status = CASE WHEN EXISTS (
                SELECT 1 FROM mefor_work w WHERE w.message_id = p_message_id AND w.stage = 'ingress' AND w.status = (SELECT 'pending'))
                THEN 'received' ELSE 'routed' END,
            error = NULL, updated_at = clock_timestamp()
        WHERE m.id = p_message_id
        RETURNING m.status INTO st;
        INSERT INTO mefor_event (message_id, event, detail)
        VALUES (p_message_id, 'replayed', CASE WHEN md = 'resend'
            THEN format('re-sending %s delivered row(s)', n) ELSE format('re-queued %s row(s)', n) END);
        PERFORM mefor_wake_lanes(expedited);
    END IF;
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'replay',
        mefor_op_target(p_target, jsonb_build_object('message_id', p_message_id, 'mode', md, 'rows', n, 'status', st)), 'ok');
    RETURN QUERY SELECT md, n, st;
END $$;

-- mefor_replay_dead is one batch of pipeline.ReplayDeadBatch and
-- ops.ReplayDead: up to p_limit dead outbound rows matching the filters
-- with p_after < id <= p_up_to, in id order, re-queued at the back of their
-- lanes (a row whose body was purged is skipped), lanes activated, their
-- messages from error back to routed with a replayed event per row, and the
-- replay-dead audit row appended, unless the batch saw no row (the end of
-- the run).
CREATE FUNCTION mefor_replay_dead(p_channel text, p_destination text, p_after bigint, p_up_to bigint, p_limit integer,
    p_os_user text, p_host text, p_target text)
RETURNS TABLE (seen integer, n_rows integer, skipped integer, messages integer, last_id bigint, lanes text[])
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n_seen integer;
    n_skipped integer;
    last bigint;
    ids bigint[];
    msgs bigint[];
    c_lanes text[];
    n integer := 0;
    n_msgs integer := 0;
    r_lanes text[];
    rq_work bigint[];
    rq_msg bigint[];
    rq_dest text[];
BEGIN
    SELECT count(*), count(*) FILTER (WHERE c.purged), max(c.id),
        array_agg(c.id ORDER BY c.id) FILTER (WHERE NOT c.purged),
        array_agg(c.message_id ORDER BY c.id) FILTER (WHERE NOT c.purged),
        array_agg(c.lane ORDER BY c.id) FILTER (WHERE NOT c.purged)
        INTO n_seen, n_skipped, last, ids, msgs, c_lanes
    FROM (
        SELECT w.id, w.lane, w.message_id, m.body_purged_at IS NOT NULL AS purged
        FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
        WHERE w.stage = 'outbound' AND w.status = 'dead' AND w.id > p_after AND w.id <= p_up_to
          AND (coalesce(p_channel, '') = '' OR w.channel = p_channel)
          AND (coalesce(p_destination, '') = '' OR w.destination = p_destination)
        ORDER BY w.id
        LIMIT p_limit
    ) c;
    IF n_seen = 0 THEN
        RETURN QUERY SELECT 0, 0, 0, 0, 0::bigint, '{}'::text[];
        RETURN;
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM mefor_lock_lanes(c_lanes);
        PERFORM 1 FROM mefor_work w WHERE w.id = ANY(ids) ORDER BY w.id FOR UPDATE;
        PERFORM mefor_lock_messages(msgs);
        SELECT count(*), array_agg(DISTINCT q.lane), array_agg(q.work_id ORDER BY q.work_id),
            array_agg(q.message_id ORDER BY q.work_id), array_agg(q.destination ORDER BY q.work_id)
            INTO n, r_lanes, rq_work, rq_msg, rq_dest
        FROM mefor_requeue(ids, ARRAY['dead']) q;
        IF n > 0 THEN
            PERFORM mefor_activate_lanes(r_lanes);
            UPDATE mefor_message m SET status = 'routed', error = NULL, updated_at = clock_timestamp()
            WHERE m.id = ANY(rq_msg) AND m.status = 'error';
            INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
            SELECT u.m, 'replayed', u.w, NULLIF(u.d, ''), 'dead-letter replay'
            FROM unnest(rq_msg, rq_work, rq_dest) WITH ORDINALITY AS u(m, w, d, k) ORDER BY u.k;
            SELECT count(DISTINCT x) INTO n_msgs FROM unnest(rq_msg) AS x;
        END IF;
    END IF;
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'replay-dead',
        mefor_op_target(p_target, jsonb_build_object('rows', n, 'messages', n_msgs, 'last_work_id', last)
            || CASE WHEN n_skipped > 0 THEN jsonb_build_object('skipped', n_skipped) ELSE '{}'::jsonb END), 'ok');
    RETURN QUERY SELECT n_seen, n, n_skipped, n_msgs, last, coalesce(r_lanes, '{}');
END $$;

-- mefor_cancel is one batch of pipeline.CancelBatch and ops.Cancel: up to
-- p_limit pending outbound rows of p_destination (of p_channel when not
-- empty; with p_top only each lane's head that has failed) with p_after <
-- id <= p_up_to. Rows of a lane whose drainer is running are marked for
-- it (it may be sending one), the others cancelled with a cancelled event
-- and their messages finalized. The drainers' job rows are locked first,
-- in id order, then the lanes, then the rows. The snoozed drainers of the
-- lanes with cancelled rows are woken, and the cancel audit row appended,
-- unless the batch saw no row.
CREATE FUNCTION mefor_cancel(p_destination text, p_channel text, p_top boolean, p_after bigint, p_up_to bigint,
    p_limit integer, p_os_user text, p_host text, p_target text)
RETURNS TABLE (seen integer, n_rows integer, messages integer, last_id bigint, marked bigint[], lanes text[])
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    ids bigint[];
    c_lanes text[];
    running text[];
    now_ids bigint[];
    later bigint[];
    m_ids bigint[];
    c record;
BEGIN
    IF coalesce(p_destination, '') = '' THEN
        RAISE EXCEPTION 'cancel needs a destination' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_top THEN
        SELECT array_agg(h.id ORDER BY h.id), array_agg(h.lane ORDER BY h.id) INTO ids, c_lanes FROM (
            SELECT h.id, h.lane FROM (
                SELECT DISTINCT ON (w.lane) w.id, w.lane, w.channel, w.attempts FROM mefor_work w
                WHERE w.stage = 'outbound' AND w.status = 'pending' AND w.destination = p_destination
                ORDER BY w.lane, w.seq
            ) h
            WHERE h.attempts > 0 AND (coalesce(p_channel, '') = '' OR h.channel = p_channel) AND h.id > p_after AND h.id <= p_up_to
            ORDER BY h.id
            LIMIT p_limit
        ) h;
    ELSE
        SELECT array_agg(w.id ORDER BY w.id), array_agg(w.lane ORDER BY w.id) INTO ids, c_lanes FROM (
            SELECT w.id, w.lane FROM mefor_work w
            WHERE w.stage = 'outbound' AND w.status = 'pending' AND w.destination = p_destination
              AND (coalesce(p_channel, '') = '' OR w.channel = p_channel) AND w.id > p_after AND w.id <= p_up_to
            ORDER BY w.id
            LIMIT p_limit
        ) w;
    END IF;
    IF ids IS NULL THEN
        RETURN QUERY SELECT 0, 0, 0, 0::bigint, '{}'::bigint[], '{}'::text[];
        RETURN;
    END IF;
    running := mefor_lock_drainers(c_lanes);
    PERFORM mefor_lock_lanes(c_lanes);
    PERFORM 1 FROM mefor_work w WHERE w.id = ANY(ids) ORDER BY w.id FOR UPDATE;
    SELECT array_agg(u.id ORDER BY u.id) FILTER (WHERE NOT (u.lane = ANY(running))),
           array_agg(u.id ORDER BY u.id) FILTER (WHERE u.lane = ANY(running))
        INTO now_ids, later
    FROM unnest(ids, c_lanes) AS u(id, lane);
    IF later IS NOT NULL THEN
        WITH m AS (
            UPDATE mefor_work w SET cancel_requested_at = clock_timestamp(), updated_at = clock_timestamp()
            WHERE w.id = ANY(later) AND w.status = (SELECT 'pending')
            RETURNING w.id
        )
        SELECT array_agg(m.id ORDER BY m.id) INTO m_ids FROM m;
    END IF;
    c := mefor_cancel_work(now_ids);
    PERFORM mefor_wake_lanes(c.lanes);
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'cancel',
        mefor_op_target(p_target, jsonb_build_object('marked', coalesce(cardinality(m_ids), 0), 'rows', c.n_rows,
            'messages', c.n_messages, 'last_work_id', ids[cardinality(ids)])), 'ok');
    RETURN QUERY SELECT cardinality(ids), c.n_rows, c.n_messages, ids[cardinality(ids)], coalesce(m_ids, '{}'),
        coalesce(c.lanes, '{}');
END $$;

-- mefor_cancel_marked_idle is pipeline.CancelMarkedIdle for ops.Cancel's
-- wait: the rows marked for cancelling in those of p_lanes whose drainer
-- is not running (nobody is sending them) cancelled, the others left to
-- their drainer; the lanes' snoozed drainers woken, and a cancel audit row
-- appended when it cancelled any.
CREATE FUNCTION mefor_cancel_marked_idle(p_lanes text[], p_os_user text, p_host text, p_target text)
RETURNS TABLE (n_rows integer, messages integer, lanes text[])
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    running text[];
    idle text[];
    ids bigint[];
    c record;
BEGIN
    running := mefor_lock_drainers(p_lanes);
    SELECT array_agg(DISTINCT l) INTO idle FROM unnest(p_lanes) AS l WHERE NOT (l = ANY(running));
    IF idle IS NULL THEN
        RETURN QUERY SELECT 0, 0, '{}'::text[];
        RETURN;
    END IF;
    PERFORM mefor_lock_lanes(idle);
    SELECT array_agg(w.id ORDER BY w.id) INTO ids FROM mefor_work w
    WHERE w.lane = ANY(idle) AND w.cancel_requested_at IS NOT NULL AND w.status = 'pending';
    c := mefor_cancel_work(ids);
    IF c.n_rows > 0 THEN
        PERFORM mefor_wake_lanes(c.lanes);
        PERFORM mefor_audit_append(p_os_user, p_host, '', 'cancel',
            mefor_op_target(p_target, jsonb_build_object('rows', c.n_rows, 'messages', c.n_messages)), 'ok');
    END IF;
    RETURN QUERY SELECT c.n_rows, c.n_messages, coalesce(c.lanes, '{}');
END $$;

-- mefor_enqueue_id draws the id of the message this session enqueues
-- next, for a caller that seals the body before storing it (a sealed value
-- is bound to its message's id). Operators cannot draw from the sequence
-- themselves.
CREATE FUNCTION mefor_enqueue_id() RETURNS bigint
LANGUAGE sql SECURITY DEFINER AS $$
    SELECT nextval(pg_get_serial_sequence('mefor_message', 'id'))
$$;

-- mefor_enqueue stores one message for `mefor enqueue` as intake would
-- have received it: the message, its received event and, when it parsed
-- (p_error NULL), its ingress row under the ingress lane's lock and the
-- lane's activation; when it did not, status error with p_error (sealed by
-- the caller) and a failed event. The id is the one mefor_enqueue_id drew
-- last in this session (p_id must name it), or a fresh one when p_id is
-- NULL: a caller never picks an id, so content sealed for another row
-- cannot be given that row's id. The status is the function's. Appends the
-- enqueue audit row (p_target with the message id) last, and returns the
-- id.
CREATE FUNCTION mefor_enqueue(p_id bigint, p_channel text, p_control_id text, p_message_type text, p_trigger_event text,
    p_sending_app text, p_sending_facility text, p_size integer, p_raw bytea, p_patient_key text, p_error text,
    p_os_user text, p_host text, p_target text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
    v_lane text;
BEGIN
    IF p_channel IS NULL OR p_channel !~ '^[a-z0-9][a-z0-9_.-]*$' THEN
        RAISE EXCEPTION 'mefor_enqueue: not a channel name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_raw IS NULL OR p_size IS NULL OR p_size < 0 THEN
        RAISE EXCEPTION 'mefor_enqueue: a message needs a body and its size' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_id IS NULL THEN
        v_id := nextval(pg_get_serial_sequence('mefor_message', 'id'));
    ELSE
        BEGIN
            v_id := currval(pg_get_serial_sequence('mefor_message', 'id'));
        EXCEPTION WHEN object_not_in_prerequisite_state THEN
            v_id := NULL;
        END;
        IF v_id IS DISTINCT FROM p_id THEN
            RAISE EXCEPTION 'mefor_enqueue: message id % was not the last mefor_enqueue_id drew in this session', p_id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF p_error IS NULL THEN
        v_lane := 'ingress:' || p_channel;
        PERFORM mefor_lock_lanes(ARRAY[v_lane]);
        INSERT INTO mefor_message (id, channel, source, control_id, message_type, trigger_event, sending_app,
            sending_facility, size, raw, status, patient_key)
        OVERRIDING SYSTEM VALUE
        VALUES (v_id, p_channel, 'enqueue', NULLIF(p_control_id, ''), NULLIF(p_message_type, ''), NULLIF(p_trigger_event, ''),
            NULLIF(p_sending_app, ''), NULLIF(p_sending_facility, ''), p_size, p_raw, 'received', NULLIF(p_patient_key, ''));
        INSERT INTO mefor_event (message_id, event, detail) VALUES (v_id, 'received', 'enqueue');
        INSERT INTO mefor_work (message_id, stage, lane, channel) VALUES (v_id, 'ingress', v_lane, p_channel);
        PERFORM mefor_activate_lanes(ARRAY[v_lane]);
    ELSE
        INSERT INTO mefor_message (id, channel, source, size, raw, status, error)
        OVERRIDING SYSTEM VALUE
        VALUES (v_id, p_channel, 'enqueue', p_size, p_raw, 'error', p_error);
        INSERT INTO mefor_event (message_id, event, detail) VALUES (v_id, 'received', 'enqueue'), (v_id, 'failed', p_error);
    END IF;
    PERFORM mefor_audit_append(p_os_user, p_host, '', 'enqueue',
        mefor_op_target(p_target, jsonb_build_object('message_id', v_id)), 'ok');
    RETURN v_id;
END $$;

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'mefor_lane_key(text)', 'mefor_lock_lanes(text[])', 'mefor_lock_messages(bigint[])', 'mefor_finalize(bigint[])',
        'mefor_notify_queues(text[])', 'mefor_activate_lanes(text[])', 'mefor_wake_lanes(text[])',
        'mefor_requeue(bigint[], text[])', 'mefor_cancel_work(bigint[])', 'mefor_lock_drainers(text[])',
        'mefor_op_target(text, jsonb)',
        'mefor_replay(bigint, text, text, text)',
        'mefor_replay_dead(text, text, bigint, bigint, integer, text, text, text)',
        'mefor_cancel(text, text, boolean, bigint, bigint, integer, text, text, text)',
        'mefor_cancel_marked_idle(text[], text, text, text)',
        'mefor_enqueue_id()',
        'mefor_enqueue(bigint, text, text, text, text, text, text, integer, bytea, text, text, text, text, text)'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
