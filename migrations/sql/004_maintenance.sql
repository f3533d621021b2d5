-- Scheduled maintenance: one audit row per run of a maintenance job (retention,
-- reclaim when run by hand, reference syncs), so `mefor maintenance list` can
-- show each job's last run and outcome whichever node worked it.
CREATE TABLE mefor_maintenance_run (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job         text        NOT NULL,
    node_id     text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    outcome     text        NOT NULL,
    -- Counts and settings of the run; never message content.
    detail      jsonb       NOT NULL DEFAULT '{}',
    error       text,
    CONSTRAINT mefor_maintenance_run_outcome_check CHECK (outcome IN ('ok', 'failed'))
);
-- "Last run of each job" and "runs of one job since".
CREATE INDEX mefor_maintenance_run_job ON mefor_maintenance_run (job, id);

-- Retention walks the messages whose body is still kept, oldest first, and
-- `mefor status` shows the oldest of them. Without this index both would scan
-- every message ever received, purged or not; intake pays one small index
-- entry per message, which retention removes again.
CREATE INDEX mefor_message_body_kept ON mefor_message (id) WHERE body_purged_at IS NULL;
