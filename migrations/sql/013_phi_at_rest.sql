-- PHI at rest: the audit log of operator actions and each node's encryption.

-- Every operator action (replay, cancel, stepdown, reload, a body viewed,
-- key rotation, ...), one row each, never message content. The rows form a
-- SHA-256 chain: each row's hash covers its fields and the previous row's
-- hash, so altering or deleting a row breaks every hash after it
-- (`mefor audit verify`), and an anchor kept elsewhere (`mefor audit
-- anchor`) exposes a cut tail. seq is drawn by the writer as the head's
-- seq + 1 under an advisory lock; the primary key refuses a fork even from a
-- writer that skipped the lock.
CREATE TABLE mefor_audit (
    seq        bigint      PRIMARY KEY,
    at         timestamptz NOT NULL,
    os_user    text        NOT NULL,
    db_role    text        NOT NULL,
    host       text        NOT NULL,
    -- The node, for actions a node took (a stepdown it answered, a reload).
    node_id    text,
    action     text        NOT NULL,
    -- What was acted on: message ids, destination, filters and counts, as
    -- canonical JSON (the exact text the hash covers).
    target     text        NOT NULL,
    outcome    text        NOT NULL,
    prev_hash  text        NOT NULL,
    hash       text        NOT NULL,
    CONSTRAINT mefor_audit_seq_positive CHECK (seq > 0)
);
CREATE INDEX mefor_audit_at ON mefor_audit (at);
CREATE INDEX mefor_audit_action ON mefor_audit (action, seq);

-- The database role is the one thing about "who" the server knows for
-- itself: a row must name the role that inserts it.
CREATE FUNCTION mefor_audit_check_role() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.db_role IS DISTINCT FROM current_user::text THEN
        RAISE EXCEPTION 'mefor_audit: db_role % is not the inserting role %', NEW.db_role, current_user
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER mefor_audit_check_role BEFORE INSERT ON mefor_audit
    FOR EACH ROW EXECUTE FUNCTION mefor_audit_check_role();

-- A transform state key can be a patient identifier (scripts choose them).
-- With encryption on, mefor_state.key holds the key's keyed blind index and
-- key_sealed the key itself, encrypted, so a key rotation can index it
-- again under the new key. NULL: the key is stored as it is (encryption
-- off).
ALTER TABLE mefor_state ADD COLUMN key_sealed bytea;

-- What each node seals content with, as it last recorded it at start: the
-- active key id (NULL: encryption off) and the ids it can open. Key
-- material never reaches the database. `mefor status` reads it to say
-- whether the cluster encrypts, and which key is active where.
CREATE TABLE mefor_node_encryption (
    node_id     text        PRIMARY KEY REFERENCES mefor_node (id) ON DELETE CASCADE,
    active_key  text,
    key_ids     text[]      NOT NULL DEFAULT '{}',
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
