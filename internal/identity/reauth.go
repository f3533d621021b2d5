package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
)

// ReauthWindow is how long a re-authentication lets its session do what
// needs one (stepdown, key rotation, user and token changes): a session left open
// on an unattended screen cannot.
const ReauthWindow = 5 * time.Minute

// ErrReauthFailed is the one answer to every refused re-authentication:
// wrong password or code, no second factor enrolled, or the account
// locked. The reason is in the audit log.
var ErrReauthFailed = errors.New("re-authentication failed: wrong password or code, no second factor enrolled, or the account is locked")

// ErrUseSSOReauth is a password re-authentication of a session whose user
// logs in through SSO and has no mefor password.
var ErrUseSSOReauth = errors.New("you sign in through single sign-on and have no mefor password: " +
	"re-authenticate at the identity provider with GET /api/v1/sso/reauth")

// ReauthRequest is a session's person proving their password and second
// factor again.
type ReauthRequest struct {
	SessionID int64
	Password  string
	// TOTP is the six-digit code, or a recovery code. Re-authentication
	// always needs one: a user without a second factor cannot
	// re-authenticate.
	TOTP string
	// Source is the client's address, for the audit row.
	Source string
}

// reasonNoMFA is a re-authentication of a user with no second factor.
const reasonNoMFA = "mfa-not-enrolled"

// Reauth checks the password and second factor of the session's user and
// records the time on the session (Options.Now's clock). A wrong password
// or code counts towards the account's lockout as a failed login does, so
// a stolen session cannot guess the password here. Every attempt is
// audited (action reauth) naming the user; a refusal is ErrReauthFailed,
// an unknown or ended session ErrUnauthenticated.
func (s *Store) Reauth(ctx context.Context, req ReauthRequest) error {
	var (
		name   string
		stored *string
	)
	err := s.db.QueryRow(ctx, `
		SELECT u.name, u.password_hash FROM mefor_session s JOIN mefor_user u ON u.id = s.user_id
		WHERE s.id = $1 AND s.revoked_at IS NULL AND now() < s.expires_at`, req.SessionID).Scan(&name, &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrUnauthenticated
	}
	if err != nil {
		return fmt.Errorf("read session %d for re-authentication: %w", req.SessionID, err)
	}
	if stored == nil {
		// A person of the directory has no mefor password. The session is
		// theirs, so saying so tells nobody anything new.
		if err := audit.AppendAlone(ctx, s.db, audit.Entry{Action: audit.ActionReauth, Actor: name, Outcome: audit.OutcomeFailed,
			Target: map[string]any{"method": "password", "source": req.Source, "session_id": req.SessionID, "reason": reasonSSOPasswordUser}}); err != nil {
			return fmt.Errorf("audit refused re-authentication: %w", err)
		}
		return ErrUseSSOReauth
	}
	checked := *stored
	// Hashed outside the transaction, as for a login.
	ok, err := s.verify(checked, req.Password)
	if err != nil {
		return fmt.Errorf("check password of %s: %w", name, err)
	}
	refused := false
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		target := map[string]any{"method": "password", "source": req.Source, "session_id": req.SessionID}
		fail := func(reason string) error {
			refused = true
			target["reason"] = reason
			return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionReauth, Actor: name, Outcome: audit.OutcomeFailed, Target: target})
		}
		var (
			id               int64
			hash             string
			secret           *string
			lastStep         int64
			disabled, locked bool
		)
		err := tx.QueryRow(ctx, `
			SELECT id, password_hash, totp_secret, totp_last_step, disabled, coalesce(locked_until > now(), false)
			FROM mefor_user WHERE name = $1 FOR UPDATE`, name).Scan(&id, &hash, &secret, &lastStep, &disabled, &locked)
		if errors.Is(err, pgx.ErrNoRows) {
			return fail(reasonUnknownUser)
		}
		if err != nil {
			return fmt.Errorf("read user for re-authentication: %w", err)
		}
		switch {
		case disabled:
			return fail(reasonDisabled)
		case locked:
			return fail(reasonLocked)
		case !ok || hash != checked:
			return s.failed(ctx, tx, id, target, fail, reasonPassword)
		case secret == nil:
			return fail(reasonNoMFA)
		}
		code := strings.TrimSpace(req.TOTP)
		if code == "" {
			return s.failed(ctx, tx, id, target, fail, reasonNoCode)
		}
		used, err := s.secondFactor(ctx, tx, id, *secret, code, lastStep)
		if err != nil {
			return err
		}
		if used == "" {
			return s.failed(ctx, tx, id, target, fail, reasonCode)
		}
		target["mfa"] = used
		if _, err := tx.Exec(ctx, `UPDATE mefor_user SET failed_count = 0, failed_since = NULL WHERE id = $1`, id); err != nil {
			return fmt.Errorf("clear failed logins of %s: %w", name, err)
		}
		tag, err := tx.Exec(ctx, `UPDATE mefor_session SET reauth_at = $2 WHERE id = $1 AND user_id = $3 AND revoked_at IS NULL`,
			req.SessionID, s.opts.Now(), id)
		if err != nil {
			return fmt.Errorf("record re-authentication of session %d: %w", req.SessionID, err)
		}
		if tag.RowsAffected() == 0 {
			return ErrUnauthenticated
		}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionReauth, Actor: name, Target: target})
	})
	if err != nil {
		return err
	}
	if refused {
		return ErrReauthFailed
	}
	return nil
}

// ReauthFresh reports whether session id re-authenticated within
// ReauthWindow, by Options.Now's clock.
func (s *Store) ReauthFresh(ctx context.Context, sessionID int64) (bool, error) {
	var at *time.Time
	err := s.db.QueryRow(ctx, `SELECT reauth_at FROM mefor_session WHERE id = $1 AND revoked_at IS NULL`, sessionID).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read re-authentication of session %d: %w", sessionID, err)
	}
	return at != nil && s.opts.Now().Sub(*at) <= ReauthWindow, nil
}

// ReauthFor are the permissions whose actions need a re-authentication
// within ReauthWindow: planned failover, key rotation, user changes and
// the creation or revocation of API tokens (a token is a credential
// acting as a user, so issuing one is a user change). An API token has no
// session to re-authenticate, so it cannot do them.
var ReauthFor = []Permission{PermStepdown, PermKeysRotate, PermUsers, PermTokens}

// NeedsReauth reports whether an action of permission p needs a fresh
// re-authentication.
func NeedsReauth(p Permission) bool { return slices.Contains(ReauthFor, p) }
