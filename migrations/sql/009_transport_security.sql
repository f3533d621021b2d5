-- Transport security.

-- The subject of the verified client certificate a message arrived with
-- (mutual TLS), shown by `mefor messages show` as the source identity. NULL
-- for a plaintext listener, a TLS listener that does not ask for client
-- certificates, and `mefor enqueue`.
ALTER TABLE mefor_message ADD COLUMN source_identity text;

-- Each node's transport security as it last recorded it, at start and at
-- each reload: the certificates it loaded from its own files, and how each
-- channel listens (TLS or plaintext, on which address). `mefor status` reads
-- it, so an operator sees every certificate in use and every plaintext
-- listener without the nodes' files.
CREATE TABLE mefor_node_transport (
    node_id      text        PRIMARY KEY REFERENCES mefor_node (id) ON DELETE CASCADE,
    certificates jsonb       NOT NULL,
    listeners    jsonb       NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
