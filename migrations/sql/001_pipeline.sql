-- The staged pipeline: messages, their per-stage work rows, the event timeline,
-- partner replies, and the lane registry used to activate one drainer per lane.

-- One row per received message. The raw body is bytea because HL7 v2 does not
-- promise UTF-8 (8859-1 is common); retention nulls it and keeps the metadata.
CREATE TABLE mefor_message (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel         text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    source          text        NOT NULL,
    remote_addr     text,
    control_id      text,
    message_type    text,
    trigger_event   text,
    sending_app     text,
    sending_facility text,
    size            integer     NOT NULL,
    raw             bytea,
    body_purged_at  timestamptz,
    status          text        NOT NULL,
    error           text,
    CONSTRAINT mefor_message_status_check CHECK (
        status IN ('received', 'routed', 'unrouted', 'filtered', 'processed', 'error'))
);
CREATE INDEX mefor_message_channel_id ON mefor_message (channel, id);
CREATE INDEX mefor_message_status_id ON mefor_message (status, id);
CREATE INDEX mefor_message_control_id ON mefor_message (channel, control_id);
CREATE INDEX mefor_message_received_at ON mefor_message (received_at);

-- Lane order is seq, drawn under the lane's transaction lock so that seq order is
-- commit order within a lane. Replay draws a fresh seq to go to the back.
CREATE SEQUENCE mefor_work_seq;

-- One row per unit of stage work. stage/lane/seq place it in a lane; attempts,
-- next_attempt_at and last_error carry the retry state of a delivery.
CREATE TABLE mefor_work (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      bigint      NOT NULL REFERENCES mefor_message (id) ON DELETE CASCADE,
    stage           text        NOT NULL,
    lane            text        NOT NULL,
    seq             bigint      NOT NULL DEFAULT nextval('mefor_work_seq'),
    channel         text        NOT NULL,
    route           text,
    handler         text,
    destination     text,
    payload         bytea,
    status          text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    CONSTRAINT mefor_work_stage_check CHECK (stage IN ('ingress', 'routed', 'outbound')),
    CONSTRAINT mefor_work_status_check CHECK (status IN ('pending', 'done', 'dead', 'cancelled'))
);
-- The drainer's head-of-lane read, and reclaim's "lanes with backlog".
CREATE INDEX mefor_work_lane_pending ON mefor_work (lane, seq) WHERE status = 'pending';
CREATE INDEX mefor_work_message ON mefor_work (message_id);
CREATE INDEX mefor_work_dead ON mefor_work (destination, id) WHERE status = 'dead';

-- The timeline shown by `mefor messages show`. detail never holds message content.
CREATE TABLE mefor_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  bigint      NOT NULL REFERENCES mefor_message (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    event       text        NOT NULL,
    work_id     bigint,
    destination text,
    detail      text
);
CREATE INDEX mefor_event_message ON mefor_event (message_id, id);

-- What a partner answered to each delivery attempt (the ACK it sent, if any).
CREATE TABLE mefor_response (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  bigint      NOT NULL REFERENCES mefor_message (id) ON DELETE CASCADE,
    work_id     bigint      NOT NULL,
    destination text        NOT NULL,
    attempt     integer     NOT NULL,
    outcome     text        NOT NULL,
    ack_code    text,
    body        bytea,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX mefor_response_message ON mefor_response (message_id, id);

-- One row per lane that has ever been activated: which River job drains it.
-- Lets an enqueuer see a live drainer with one indexed read instead of a
-- unique-insert conflict (an UPDATE of the drainer's river_job row) per message.
CREATE TABLE mefor_lane (
    name          text        PRIMARY KEY,
    stage         text        NOT NULL,
    job_id        bigint,
    activated_at  timestamptz
);
