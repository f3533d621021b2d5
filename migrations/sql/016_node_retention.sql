-- Each node's retention policy as it last recorded it, at start and at each
-- reload, so `mefor status` shows what the cluster runs with (keep_errors
-- applies even to a file without a retention block). Windows in seconds;
-- NULL: never.
CREATE TABLE mefor_node_retention (
    node_id             text        PRIMARY KEY REFERENCES mefor_node (id) ON DELETE CASCADE,
    keep_bodies         bigint,
    keep_dead           bigint,
    keep_errors         bigint,
    keep_errors_default boolean     NOT NULL,
    delete_after        bigint,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
