-- Dual control and re-authentication for the API's actions (issue 50).
--
-- mefor_session.reauth_at is when the session's person last proved their
-- password and second factor again (POST /api/v1/reauth); stepdown, key
-- rotation and user changes need it within the last five minutes. Written
-- by package internal/identity, which owns the table.
ALTER TABLE mefor_session ADD COLUMN reauth_at timestamptz;

-- An action that access.approvals.required_for names waits here for a
-- second person (package internal/approval, its only writer). The row
-- moves pending -> running (an approver claimed it: the action runs now,
-- once) -> done or failed, or pending -> rejected; a pending row past
-- expires_at is never claimed. The transitions are single UPDATEs guarded
-- by the state, so two approvers racing cannot both run it. params hold
-- what the action acts on (a message id, a channel and destination, a
-- node), never content.
CREATE TABLE mefor_approval (
    id                 bigserial   PRIMARY KEY,
    -- The permission name of the action: replay, replay-dead, cancel,
    -- stepdown.
    action             text        NOT NULL,
    params             jsonb       NOT NULL DEFAULT '{}',
    requested_by       text        NOT NULL,
    -- The requester's channel patterns when they asked; the action runs
    -- only on channels both they and the approver see.
    requested_channels text[]      NOT NULL DEFAULT '{}',
    requested_source   text        NOT NULL DEFAULT '',
    requested_at       timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL,
    state              text        NOT NULL DEFAULT 'pending',
    decided_by         text,
    decided_source     text,
    decided_at         timestamptz,
    -- What the action answered (counts, ids), or why it failed.
    result             jsonb,
    error              text,
    finished_at        timestamptz,
    CONSTRAINT mefor_approval_state CHECK (state IN ('pending', 'rejected', 'running', 'done', 'failed')),
    CONSTRAINT mefor_approval_two_people CHECK (decided_by IS NULL OR decided_by <> requested_by)
);
CREATE INDEX mefor_approval_pending ON mefor_approval (id) WHERE state = 'pending';
