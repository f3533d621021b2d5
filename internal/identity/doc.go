// Package identity owns mefor's people: users with a role and channel
// scope, their passwords and second factors, login sessions and API tokens
// (tables mefor_user, mefor_user_recovery_code, mefor_session and
// mefor_api_token, migration 023, readable by mefor_admin only).
//
// # What is stored, and how
//
// Nothing stored logs anyone in. A password is an argon2id hash in a PHC
// string (see HashPassword). Session and API tokens are 32 random bytes
// shown once; only their SHA-256 is stored, which is enough for values
// that cannot be guessed. Recovery codes carry 80 random bits and are
// stored the same way. The TOTP secret must be readable to check a code:
// it is sealed under MEFOR_ENCRYPTION_KEYS (column mefor_user.totp_secret)
// when the keys are set, and stored in clear otherwise, which docs/access.md
// says, since the table is then only as safe as the database's grants.
//
// # Logins
//
// Login hashes the password first (always, also for an unknown user,
// against a dummy hash, so the answer takes as long), outside any
// transaction, then checks the account's state and the second factor and
// counts a failure under the user's row lock. Every refusal is the same
// ErrLoginFailed, whatever the reason; the reason goes to the audit log,
// which records every attempt with the user name tried as its actor. Five
// failures within 15 minutes lock the account for 15 minutes; a locked
// account's attempts are refused and recorded but do not extend the lock.
// A TOTP code works once: the step it belongs to is stored, and a code of
// that step or an earlier one is refused.
//
// # Re-authentication
//
// Some actions (ReauthFor: stepdown, key rotation, user and token
// changes) need the session's person to have given their password and
// second factor again within ReauthWindow. Reauth checks them as Login does, counting a
// failure towards the same lockout, and stamps mefor_session.reauth_at
// with Options.Now; ReauthFresh compares that stamp with the same clock.
// A user without a second factor cannot re-authenticate; an API token has
// no session, so it never holds a fresh re-authentication.
//
// # Single sign-on
//
// A person the organization's OpenID Connect provider authenticated is a
// user without a password (migration 025), found by the ID token's issuer
// and subject. The protocol is package api's; this package keeps what must
// hold across nodes and be used once: a login under way (BeginSSO) is a
// row of mefor_sso_login keyed by its state's SHA-256 and bound to the
// starting browser's cookie, and ResumeSSO deletes it before anything
// else, so a replayed or planted callback is refused on every node. The
// person's groups give their role and channels (SSOLogin, mapGroups): only
// groups of access.groups count, their channels add up, and groups of
// different roles are refused rather than ranked, since custom roles have
// no order. A name held by another user is refused, so a directory cannot
// take over a local account. Every SSO login, let in or refused, is an
// audited login row with method sso and the reason.
//
// Such a person has no password to re-authenticate with, so they sign in
// again at the provider: BeginSSOReauth records the same kind of row with
// purpose reauth and the session it renews (migration 028), and SSOReauth
// sets that session's reauth_at only for an ID token naming the session's
// own user, with an auth_time within ReauthWindow: a provider that let a
// standing session through has not re-authenticated anyone.
package identity
