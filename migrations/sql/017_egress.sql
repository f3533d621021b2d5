-- Where data may go.

-- Each node's egress as it last recorded it, at start and at each reload:
-- whether its config restricts outbound connections (egress.allow) and to
-- what, and the connections it makes in plaintext to other machines
-- without the config acknowledging them (target, host:port and protocol,
-- never a URL's path or query). `mefor status` reads it, so an operator
-- sees where data may leave without the nodes' files.
CREATE TABLE mefor_node_egress (
    node_id     text        PRIMARY KEY REFERENCES mefor_node (id) ON DELETE CASCADE,
    restricted  boolean     NOT NULL,
    allow       jsonb       NOT NULL,
    plaintext   jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
