-- Re-authentication through the OpenID Connect provider (package
-- internal/identity, issue 50).
--
-- A person who logs in through SSO has no mefor password, so they
-- re-authenticate by signing in again at the provider: GET
-- /api/v1/sso/reauth starts the same code flow as a login, and its row
-- says so (purpose) and names the session the callback renews. A session
-- that ends takes its re-authentications under way with it.
ALTER TABLE mefor_sso_login
    ADD COLUMN purpose    text   NOT NULL DEFAULT 'login',
    ADD COLUMN session_id bigint REFERENCES mefor_session (id) ON DELETE CASCADE,
    ADD CONSTRAINT mefor_sso_login_purpose CHECK (purpose IN ('login', 'reauth')),
    ADD CONSTRAINT mefor_sso_login_reauth_session CHECK ((purpose = 'reauth') = (session_id IS NOT NULL));
