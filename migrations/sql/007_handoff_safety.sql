-- A cancel that meets a lane whose drainer is running marks the rows instead
-- of cancelling them: the drainer may be sending one of them right now, and
-- only it knows which. The drainer (the lane's only writer) resolves the
-- marks: a row it has not sent is cancelled, one it sent is recorded as
-- delivered. The partial index keeps the drainer's "any marks?" probe free
-- while nothing is marked.
ALTER TABLE mefor_work ADD COLUMN cancel_requested_at timestamptz;
CREATE INDEX mefor_work_cancel_requested ON mefor_work (lane)
    WHERE cancel_requested_at IS NOT NULL AND status = 'pending';

-- The lane layouts (ordering mode, lane count, key) each destination has been
-- delivered under, numbered per destination in the order they were first
-- used. Lanes of a later generation carry it in their name, so rows queued
-- under an earlier ordering stay in lanes of their own, and a drainer can
-- hold its lane while older-generation lanes of its destination still have
-- lower-seq rows: an ordering change never lets a patient's new messages
-- overtake the ones queued before it.
CREATE TABLE mefor_destination_layout (
    destination   text        NOT NULL,
    layout        text        NOT NULL,
    generation    integer     NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (destination, layout),
    CONSTRAINT mefor_destination_layout_generation UNIQUE (destination, generation)
);
