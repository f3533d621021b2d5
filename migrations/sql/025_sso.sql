-- Single sign-on with OpenID Connect (package internal/identity, issue 50).
--
-- A person who logs in through the directory is a mefor_user like any other
-- (sessions, audit rows and `mefor user list` name them), found by the
-- issuer and subject of their ID token, with no password: their role and
-- channels are derived from their directory groups at each login.
ALTER TABLE mefor_user
    ALTER COLUMN password_hash DROP NOT NULL,
    ADD COLUMN sso_issuer  text,
    ADD COLUMN sso_subject text,
    ADD CONSTRAINT mefor_user_sso UNIQUE (sso_issuer, sso_subject),
    ADD CONSTRAINT mefor_user_sso_pair CHECK ((sso_issuer IS NULL) = (sso_subject IS NULL)),
    ADD CONSTRAINT mefor_user_credential CHECK (password_hash IS NOT NULL OR sso_subject IS NOT NULL);

-- Logins under way: one row from GET /api/v1/sso/login to its callback,
-- deleted by the callback (so a state, and the code that came with it,
-- is used once) or when it expires. The browser that started the login
-- holds a random value in a cookie whose SHA-256 is browser_hash: a
-- callback from another browser is refused. The state is stored as its
-- SHA-256; the nonce and the PKCE verifier must be read back as they are,
-- and are worth nothing without the browser's code, for ten minutes.
CREATE TABLE mefor_sso_login (
    state_hash   bytea       PRIMARY KEY,
    browser_hash bytea       NOT NULL,
    nonce        text        NOT NULL,
    verifier     text        NOT NULL,
    source       text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX mefor_sso_login_expires ON mefor_sso_login (expires_at);
