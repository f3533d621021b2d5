-- Transform state: small JSON values that handlers keep between messages, by
-- namespace and key (a visit count per patient). A transform's writes commit
-- in the hand-off that consumes its row, so a re-run never applies them twice.
--
-- version comes from one sequence for the whole table, so a key that is
-- deleted and written again never gets back a version it had: a node's
-- cache, checked by version in every hand-off, can then never mistake an
-- old value for the current one.
CREATE SEQUENCE mefor_state_version;

CREATE TABLE mefor_state (
    namespace   text        NOT NULL,
    key         text        NOT NULL,
    -- The JSON text of the value, as bytes: it is content (a script may keep
    -- anything a message holds), stored like message bodies.
    value       bytea       NOT NULL,
    version     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The message whose transform wrote the value last.
    message_id  bigint,
    PRIMARY KEY (namespace, key)
);
-- Retention purges state untouched for maintenance.retention.keep_state.
CREATE INDEX mefor_state_updated_at ON mefor_state (updated_at);
