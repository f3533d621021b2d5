-- Reference sets: code-mapping tables materialized from their source by the
-- reference-sync job. mefor_reference_set is the pointer to each set's live
-- snapshot; a sync writes the new version's rows and moves the pointer in one
-- transaction, so readers see the old snapshot or the new one, never a mix.
-- Nodes poll the pointers (one small query per heartbeat) and load a set's
-- rows only when its version changed.
CREATE SEQUENCE mefor_reference_version;

CREATE TABLE mefor_reference_set (
    name            text        PRIMARY KEY,
    -- 0 until the first successful sync: the set has no snapshot yet.
    version         bigint      NOT NULL DEFAULT 0,
    -- Value columns of the live snapshot, in source order; the first is
    -- what a lookup returns unless it names another.
    columns         text[]      NOT NULL DEFAULT '{}',
    row_count       integer     NOT NULL DEFAULT 0,
    synced_at       timestamptz,
    -- The source as the live snapshot was read from (no secrets).
    source          text        NOT NULL DEFAULT '',
    -- The last failed sync, cleared by the next successful one. Names the
    -- source and the problem, never row contents.
    last_error      text,
    last_error_at   timestamptz
);

CREATE TABLE mefor_reference_row (
    set_name text   NOT NULL,
    version  bigint NOT NULL,
    key      text   NOT NULL,
    -- Value columns by name, as text.
    value    jsonb  NOT NULL,
    PRIMARY KEY (set_name, version, key)
);
