-- The listener lease: one row per leased duty (today only 'listeners'). Its
-- expiry is on the database clock, so clock skew between nodes never decides
-- who may bind the inbound listeners. A stepdown expires the row but leaves
-- the owner, which is why the releasing node pauses its own claims.
CREATE TABLE mefor_leader_lease (
    key         text        PRIMARY KEY,
    owner       text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Nodes record their timings so `mefor nodes` can judge staleness without
-- the config file.
ALTER TABLE mefor_node
    ADD COLUMN heartbeat_ms bigint NOT NULL DEFAULT 1000,
    ADD COLUMN node_timeout_ms bigint NOT NULL DEFAULT 15000;

-- Operator requests carried through the database (a row plus NOTIFY
-- mefor_control), so the CLI needs only the database URL. The addressed node
-- claims the row, acts, and writes the outcome back.
CREATE TABLE mefor_control_request (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL,
    target_node  text        NOT NULL,
    options      jsonb       NOT NULL DEFAULT '{}',
    status       text        NOT NULL DEFAULT 'pending',
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    answered_at  timestamptz,
    outcome      jsonb,
    CONSTRAINT mefor_control_request_status_check CHECK (status IN ('pending', 'claimed', 'answered', 'abandoned'))
);
CREATE INDEX mefor_control_request_pending ON mefor_control_request (target_node) WHERE status = 'pending';

-- Every stepdown answer, with what actually happened rather than what was
-- asked: whether the node held the lease and when (if ever) the release
-- write landed.
CREATE TABLE mefor_stepdown_audit (
    id          bigserial   PRIMARY KEY,
    request_id  bigint,
    node_id     text        NOT NULL,
    outcome     text        NOT NULL,
    was_holder  boolean     NOT NULL,
    released_at timestamptz,
    reason      text,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
