-- Cluster-wide config version. An operator reload (`mefor reload`, or SIGHUP
-- on one node) bumps it, recording the hash of the file that was validated;
-- every node watches it and reloads its own copy of the file when the
-- version passes the one it applied. A single row: there is one config per
-- cluster.
CREATE TABLE mefor_cluster_config (
    id         boolean     PRIMARY KEY DEFAULT true,
    version    bigint      NOT NULL DEFAULT 0,
    hash       text,
    bumped_by  text,
    bumped_at  timestamptz,
    CONSTRAINT mefor_cluster_config_single CHECK (id)
);
INSERT INTO mefor_cluster_config (id) VALUES (true);

-- What each node runs: the cluster version it last applied, the hash of the
-- file it applied, and the last reload that failed (kept until one succeeds)
-- so `mefor status` and `mefor reload --wait` can say why a node is behind.
ALTER TABLE mefor_node
    ADD COLUMN config_version      bigint,
    ADD COLUMN config_hash         text,
    ADD COLUMN config_applied_at   timestamptz,
    ADD COLUMN config_error        text,
    ADD COLUMN config_error_version bigint,
    ADD COLUMN config_error_at     timestamptz;
