-- Directory intake and replies routed back in.

-- One row per file a directory channel stored: its name (relative to the
-- channel's directory), size and SHA-256, and the node that took it, written
-- in the transaction that stores the file's messages. A node that stored a file and stopped before
-- moving it away finds the file here at its next poll and moves it without
-- storing it again. The unique key is what makes a second store of the same
-- file, by any node, store nothing.
CREATE TABLE mefor_intake_file (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel       text        NOT NULL,
    name          text        NOT NULL,
    size          bigint      NOT NULL,
    sha256        bytea       NOT NULL,
    messages      integer     NOT NULL,
    node_id       text,
    stored_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT mefor_intake_file_once UNIQUE (channel, name, size, sha256)
);

-- Where a message came from when it was not received on a connection: the
-- file it was read from (and its place in that file, counting from 1), or
-- the message whose delivery it answered. reply_depth counts the replies
-- between a message and the message received from outside (0 for that
-- one), so a loop of replies stops at the destination's reply depth limit.
ALTER TABLE mefor_message
    ADD COLUMN source_file_id     bigint REFERENCES mefor_intake_file (id),
    ADD COLUMN source_file_index  integer,
    ADD COLUMN parent_id          bigint REFERENCES mefor_message (id) ON DELETE SET NULL,
    ADD COLUMN parent_response_id bigint,
    ADD COLUMN reply_depth        integer NOT NULL DEFAULT 0;

-- `messages show` lists a message's replies; only replies have a parent.
CREATE INDEX mefor_message_parent ON mefor_message (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX mefor_message_source_file ON mefor_message (source_file_id) WHERE source_file_id IS NOT NULL;
