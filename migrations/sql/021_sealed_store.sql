-- Whether this store refuses values that are not sealed bound to their row.
--
-- One row, written by `mefor keys rotate` when it has sealed every value of
-- the content columns in the row-bound form (envelope mfe2): from then on a
-- node with keys refuses a plaintext or legacy (mfe1) value there, as
-- tampered, instead of reading it. Until it exists, plaintext is accepted:
-- the migration step of turning encryption on for a store that ran without.
-- Deleting the row (a superuser) accepts plaintext again; `mefor keys
-- status` and `mefor status` show which it is.
CREATE TABLE mefor_sealed_store (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    sealed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    key_id     text        NOT NULL
);
