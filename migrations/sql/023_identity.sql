-- People, not a database URL: mefor's own users, their sessions and API
-- tokens (package internal/identity). These tables hold credentials, so
-- `mefor migrate` (migrations.grant) gives mefor_reader and mefor_operator
-- no privilege on them at all; only mefor_admin (the nodes, and the
-- administrators who run `mefor user` and `mefor token`) reads and writes
-- them. Nothing here is ever stored in a form that logs a person in:
-- passwords are argon2id hashes, tokens and recovery codes SHA-256 hashes,
-- and the TOTP secret is sealed under MEFOR_ENCRYPTION_KEYS when the keys
-- are set (text envelope mfe1:...).

CREATE TABLE mefor_user (
    id              bigserial   PRIMARY KEY,
    name            text        NOT NULL UNIQUE,
    role            text        NOT NULL,
    -- Channel patterns (path.Match syntax, lab-*); empty: every channel.
    channels        text[]      NOT NULL DEFAULT '{}',
    disabled        boolean     NOT NULL DEFAULT false,
    -- PHC string: $argon2id$v=19$m=65536,t=3,p=4$salt$hash
    password_hash   text        NOT NULL,
    -- The TOTP secret (base32), sealed when encryption keys exist; NULL
    -- when the user has no second factor.
    totp_secret     text,
    -- The last 30-second step whose code logged in: a code works once.
    totp_last_step  bigint      NOT NULL DEFAULT 0,
    -- Failed logins counted since failed_since (a 15-minute window);
    -- the fifth locks the account until locked_until.
    failed_count    integer     NOT NULL DEFAULT 0,
    failed_since    timestamptz,
    locked_until    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT mefor_user_name_form CHECK (name ~ '^[a-z0-9][a-z0-9._@-]{0,63}$')
);

-- Single-use recovery codes, SHA-256 of the code (80 random bits).
CREATE TABLE mefor_user_recovery_code (
    user_id   bigint      NOT NULL REFERENCES mefor_user (id) ON DELETE CASCADE,
    code_hash text        NOT NULL,
    used_at   timestamptz,
    PRIMARY KEY (user_id, code_hash)
);

-- Login sessions: the SHA-256 of the cookie's token, never the token.
CREATE TABLE mefor_session (
    id           bigserial   PRIMARY KEY,
    user_id      bigint      NOT NULL REFERENCES mefor_user (id) ON DELETE CASCADE,
    token_hash   bytea       NOT NULL UNIQUE,
    source       text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    -- idle: a session unused this long ends; expires_at: it ends then
    -- whatever its use (created_at + api.session_max).
    idle_timeout interval    NOT NULL,
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);
CREATE INDEX mefor_session_user ON mefor_session (user_id) WHERE revoked_at IS NULL;

-- API tokens for scripts and the CLI: the SHA-256 of the token only.
CREATE TABLE mefor_api_token (
    id           bigserial   PRIMARY KEY,
    user_id      bigint      NOT NULL REFERENCES mefor_user (id) ON DELETE CASCADE,
    token_hash   bytea       NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX mefor_api_token_user ON mefor_api_token (user_id);
