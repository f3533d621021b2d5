-- Cluster membership: every node upserts its row each heartbeat. reclaim
-- treats the drainers of a node silent for longer than node_timeout as dead
-- and makes them available again without waiting for River's rescuer.
CREATE TABLE mefor_node (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen   timestamptz NOT NULL DEFAULT clock_timestamp(),
    status      text        NOT NULL DEFAULT 'active',
    holds_lease boolean     NOT NULL DEFAULT false,
    CONSTRAINT mefor_node_status_check CHECK (status IN ('active', 'left'))
);
CREATE INDEX mefor_node_last_seen ON mefor_node (last_seen);
