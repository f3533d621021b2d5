-- Each node's listener priority, as it recorded it when it joined: a node
-- takes the listener lease over only when no live node of a higher priority
-- could, and a node of priority 0 never does (a DR site, a node being
-- drained, a processing-only node). Existing nodes count as 1, the default.
ALTER TABLE mefor_node ADD COLUMN listener_priority integer NOT NULL DEFAULT 1
    CONSTRAINT mefor_node_listener_priority_check CHECK (listener_priority >= 0);

-- When a stepdown released the lease (expires_at is set to that moment):
-- lower-priority nodes wait lease_ttl from there before they may take it
-- over ahead of a live higher-priority one. A claim clears it.
ALTER TABLE mefor_leader_lease ADD COLUMN released_at timestamptz;
