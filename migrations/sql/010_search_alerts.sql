-- Message search and mefor's own alerts.

-- The patient a message is about: PID-3.1 as intake read it, stored as
-- store.PatientKey makes it. Today that is the identifier itself; with
-- encryption at rest it becomes a keyed blind index, so the clear id is
-- never stored, and a search hashes what the operator typed the same way.
-- NULL when the message has no PID-3.1 (or did not parse).
ALTER TABLE mefor_message ADD COLUMN patient_key text;
CREATE INDEX mefor_message_patient ON mefor_message (patient_key, id) WHERE patient_key IS NOT NULL;

-- `mefor messages list --control-id` is asked without a channel: the
-- (channel, control_id) index cannot answer that, this one answers both.
DROP INDEX IF EXISTS mefor_message_control_id;
CREATE INDEX mefor_message_control ON mefor_message (control_id, id);

-- `--type ADT^A08` (or `--type ADT`), newest first within a type.
CREATE INDEX mefor_message_type ON mefor_message (message_type, trigger_event, id);

-- `--destination D`: the messages with a row for D, newest first.
CREATE INDEX mefor_work_destination_message ON mefor_work (destination, message_id) WHERE destination IS NOT NULL;

-- One row per alert rule: its state as the last evaluation found it, kept
-- here rather than in a node's memory so that a rule fires once per
-- cluster and a change of River leader neither repeats nor forgets a
-- notification. A state change and the notifications it sends commit in
-- one transaction.
CREATE TABLE mefor_alert (
    rule              text        PRIMARY KEY,
    state             text        NOT NULL DEFAULT 'ok',
    -- When the rule entered its state.
    since             timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The condition that breached (oldest_queued, queue_depth,
    -- dead_letters, no_traffic), its value and threshold, as of the last
    -- evaluation; the value is refreshed each evaluation.
    condition         text,
    value             double precision,
    threshold         double precision,
    -- Counts state changes; orders each rule's notifications.
    transitions       bigint      NOT NULL DEFAULT 0,
    evaluated_at      timestamptz,
    -- The last notification sent (or given up on) and to which sink.
    last_notified_at  timestamptz,
    last_notification text,
    last_sink         text,
    -- Why the last attempt to notify failed; cleared by a success. Never
    -- holds header values.
    last_notify_error text,
    CONSTRAINT mefor_alert_state_check CHECK (state IN ('ok', 'firing'))
);
