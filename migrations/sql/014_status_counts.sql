-- Summary counts for `mefor status`, the cluster gauges and the alerts, so
-- that they cost in proportion to the number of channels, destinations and
-- lanes rather than to the messages and rows kept.
--
-- Every statement that inserts, updates or deletes messages or work rows
-- appends, through the statement-level triggers below, one delta row per
-- (key, net change) it made: a statement, not each row, pays for one small
-- insert, and a statement that changes no counted column (a retry's attempt
-- count, a body purge) appends nothing. The deltas commit or roll back with
-- the change itself, so summing them in any snapshot gives exactly the
-- count(*) of that snapshot. Writers only append, so they never wait on
-- each other for a counter row. store.FoldCounts (run by reclaim) replaces
-- a key's deltas by their sum so the tables stay about one row per key.

CREATE TABLE mefor_message_count (
    channel text   NOT NULL,
    status  text   NOT NULL,
    n       bigint NOT NULL
);

-- destination is '' for ingress and routed rows (which have none), so the
-- key has no NULLs. Done ingress and routed rows are not counted: nothing
-- reads that count, and leaving it out spares the two most frequent
-- hand-offs a delta row each.
CREATE TABLE mefor_work_count (
    stage       text   NOT NULL,
    channel     text   NOT NULL,
    destination text   NOT NULL,
    lane        text   NOT NULL,
    status      text   NOT NULL,
    n           bigint NOT NULL
);

CREATE FUNCTION mefor_message_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_message_count (channel, status, n)
    SELECT channel, status, count(*) FROM mefor_new GROUP BY channel, status;
    RETURN NULL;
END $$;

CREATE FUNCTION mefor_message_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_message_count (channel, status, n)
    SELECT channel, status, sum(d) FROM (
        SELECT channel, status, 1 AS d FROM mefor_new
        UNION ALL
        SELECT channel, status, -1 FROM mefor_old) c
    GROUP BY channel, status HAVING sum(d) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION mefor_message_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_message_count (channel, status, n)
    SELECT channel, status, -count(*) FROM mefor_old GROUP BY channel, status;
    RETURN NULL;
END $$;

CREATE FUNCTION mefor_work_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_work_count (stage, channel, destination, lane, status, n)
    SELECT stage, channel, coalesce(destination, ''), lane, status, count(*)
    FROM mefor_new WHERE stage = 'outbound' OR status <> 'done'
    GROUP BY stage, channel, coalesce(destination, ''), lane, status;
    RETURN NULL;
END $$;

CREATE FUNCTION mefor_work_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_work_count (stage, channel, destination, lane, status, n)
    SELECT stage, channel, destination, lane, status, sum(d) FROM (
        SELECT stage, channel, coalesce(destination, '') AS destination, lane, status, 1 AS d FROM mefor_new
        WHERE stage = 'outbound' OR status <> 'done'
        UNION ALL
        SELECT stage, channel, coalesce(destination, ''), lane, status, -1 FROM mefor_old
        WHERE stage = 'outbound' OR status <> 'done') c
    GROUP BY stage, channel, destination, lane, status HAVING sum(d) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION mefor_work_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mefor_work_count (stage, channel, destination, lane, status, n)
    SELECT stage, channel, coalesce(destination, ''), lane, status, -count(*)
    FROM mefor_old WHERE stage = 'outbound' OR status <> 'done'
    GROUP BY stage, channel, coalesce(destination, ''), lane, status;
    RETURN NULL;
END $$;

-- TRUNCATE has no transition table; it empties the counts with the table.
CREATE FUNCTION mefor_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'mefor_message' THEN
        DELETE FROM mefor_message_count;
    ELSE
        DELETE FROM mefor_work_count;
    END IF;
    RETURN NULL;
END $$;

-- A trigger with transition tables may have only one event, hence three
-- per table. Creating them locks out writers until this migration commits,
-- so the counts below start exact.
CREATE TRIGGER mefor_message_count_insert AFTER INSERT ON mefor_message
    REFERENCING NEW TABLE AS mefor_new FOR EACH STATEMENT EXECUTE FUNCTION mefor_message_count_insert();
CREATE TRIGGER mefor_message_count_update AFTER UPDATE ON mefor_message
    REFERENCING OLD TABLE AS mefor_old NEW TABLE AS mefor_new FOR EACH STATEMENT EXECUTE FUNCTION mefor_message_count_update();
CREATE TRIGGER mefor_message_count_delete AFTER DELETE ON mefor_message
    REFERENCING OLD TABLE AS mefor_old FOR EACH STATEMENT EXECUTE FUNCTION mefor_message_count_delete();
CREATE TRIGGER mefor_message_count_truncate AFTER TRUNCATE ON mefor_message
    FOR EACH STATEMENT EXECUTE FUNCTION mefor_count_truncate();
CREATE TRIGGER mefor_work_count_insert AFTER INSERT ON mefor_work
    REFERENCING NEW TABLE AS mefor_new FOR EACH STATEMENT EXECUTE FUNCTION mefor_work_count_insert();
CREATE TRIGGER mefor_work_count_update AFTER UPDATE ON mefor_work
    REFERENCING OLD TABLE AS mefor_old NEW TABLE AS mefor_new FOR EACH STATEMENT EXECUTE FUNCTION mefor_work_count_update();
CREATE TRIGGER mefor_work_count_delete AFTER DELETE ON mefor_work
    REFERENCING OLD TABLE AS mefor_old FOR EACH STATEMENT EXECUTE FUNCTION mefor_work_count_delete();
CREATE TRIGGER mefor_work_count_truncate AFTER TRUNCATE ON mefor_work
    FOR EACH STATEMENT EXECUTE FUNCTION mefor_count_truncate();

INSERT INTO mefor_message_count (channel, status, n)
SELECT channel, status, count(*) FROM mefor_message GROUP BY channel, status;
INSERT INTO mefor_work_count (stage, channel, destination, lane, status, n)
SELECT stage, channel, coalesce(destination, ''), lane, status, count(*)
FROM mefor_work WHERE stage = 'outbound' OR status <> 'done'
GROUP BY stage, channel, coalesce(destination, ''), lane, status;

-- The age of the oldest pending row of each stage, channel and destination
-- (status, the gauges, the alerts) is the first entry of its range here;
-- the counts above give the groups to look up.
CREATE INDEX mefor_work_pending_age ON mefor_work (stage, channel, (coalesce(destination, '')), created_at)
    WHERE status = 'pending';
