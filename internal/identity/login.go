package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
)

// LoginRequest is one login attempt.
type LoginRequest struct {
	Username string
	Password string
	// TOTP is the six-digit code, or a recovery code.
	TOTP string
	// Source is the client's address, recorded in the audit row and the
	// session.
	Source string
}

// Login is a successful login: the session's token, shown once (the
// cookie), and who it acts as.
type Login struct {
	Token     string     `json:"-"`
	Principal *Principal `json:"principal"`
	ExpiresAt time.Time  `json:"expires_at"`
}

// Reasons a login was refused, recorded in its audit row (never answered).
const (
	reasonUnknownUser = "unknown-user"
	reasonDisabled    = "disabled"
	reasonLocked      = "locked"
	reasonPassword    = "password"
	reasonNoCode      = "mfa-code-missing"
	reasonCode        = "mfa-code"
)

// Login checks a login attempt and opens a session. Every refusal is
// ErrLoginFailed; every attempt is audited with the name tried as actor.
func (s *Store) Login(ctx context.Context, req LoginRequest) (*Login, error) {
	name := strings.ToLower(strings.TrimSpace(req.Username))
	if len(name) > 64 {
		name = name[:64]
	}
	// The password is hashed before the transaction, so the row lock and
	// the connection are not held for the hash's time; the row is read
	// again under its lock, and a password changed meanwhile is a refusal.
	// An SSO user has no password (NULL): checked like an unknown user's.
	var stored *string
	err := s.db.QueryRow(ctx, `SELECT password_hash FROM mefor_user WHERE name = $1`, name).Scan(&stored)
	known := err == nil && stored != nil
	checked := ""
	if known {
		checked = *stored
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read user for login: %w", err)
	}
	ok := false
	if known {
		if ok, err = s.verify(checked, req.Password); err != nil {
			return nil, fmt.Errorf("check password of %s: %w", name, err)
		}
	} else {
		// As long as a known user's check: the answer must not tell.
		_, _ = s.verify(s.dummyHash(), req.Password)
	}
	var out *Login
	refused := ""
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		target := map[string]any{"source": req.Source}
		fail := func(reason string) error {
			refused = reason
			target["reason"] = reason
			return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionLogin, Actor: name, Outcome: audit.OutcomeFailed, Target: target})
		}
		var (
			id               int64
			role             string
			hash, secret     *string
			lastStep         int64
			disabled, locked bool
		)
		err := tx.QueryRow(ctx, `
			SELECT id, role, password_hash, totp_secret, totp_last_step, disabled, coalesce(locked_until > now(), false)
			FROM mefor_user WHERE name = $1 FOR UPDATE`, name).
			Scan(&id, &role, &hash, &secret, &lastStep, &disabled, &locked)
		if errors.Is(err, pgx.ErrNoRows) {
			return fail(reasonUnknownUser)
		}
		if err != nil {
			return fmt.Errorf("read user for login: %w", err)
		}
		ok = ok && known && hash != nil && *hash == checked
		switch {
		case hash == nil:
			return fail(reasonSSOPasswordUser)
		case disabled:
			return fail(reasonDisabled)
		case locked:
			return fail(reasonLocked)
		case !ok:
			return s.failed(ctx, tx, id, target, fail, reasonPassword)
		}
		r := s.roleOf(role)
		if secret != nil || r.RequireMFA {
			code := strings.TrimSpace(req.TOTP)
			if code == "" || secret == nil {
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
		}
		if _, err := tx.Exec(ctx, `UPDATE mefor_user SET failed_count = 0, failed_since = NULL, locked_until = NULL WHERE id = $1`, id); err != nil {
			return fmt.Errorf("clear failed logins of %s: %w", name, err)
		}
		sid, token, err := s.createSession(ctx, tx, id, req.Source)
		if err != nil {
			return err
		}
		p := &Principal{UserID: id, Name: name, Role: r, SessionID: sid}
		var expires time.Time
		if err := tx.QueryRow(ctx, `SELECT u.channels, s.expires_at FROM mefor_user u, mefor_session s WHERE u.id = $1 AND s.id = $2`,
			id, sid).Scan(&p.Channels, &expires); err != nil {
			return fmt.Errorf("read session: %w", err)
		}
		out = &Login{Token: token, Principal: p, ExpiresAt: expires}
		target["session_id"] = sid
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionLogin, Actor: name, Target: target})
	})
	if err != nil {
		return nil, err
	}
	if refused != "" {
		return nil, ErrLoginFailed
	}
	return out, nil
}

// failed counts a failed login of user id (a wrong password or code) and
// locks the account at the LockoutFailures-th within LockoutWindow.
func (s *Store) failed(ctx context.Context, tx pgx.Tx, id int64, target map[string]any, fail func(string) error, reason string) error {
	var lockedNow bool
	err := tx.QueryRow(ctx, `
		WITH f AS (
			SELECT CASE WHEN failed_since IS NULL OR failed_since < now() - $2::interval THEN 1 ELSE failed_count + 1 END AS n,
			       CASE WHEN failed_since IS NULL OR failed_since < now() - $2::interval THEN now() ELSE failed_since END AS since
			FROM mefor_user WHERE id = $1
		)
		UPDATE mefor_user u SET
			failed_count = CASE WHEN f.n >= $3 THEN 0 ELSE f.n END,
			failed_since = CASE WHEN f.n >= $3 THEN NULL ELSE f.since END,
			locked_until = CASE WHEN f.n >= $3 THEN now() + $4::interval ELSE u.locked_until END
		FROM f WHERE u.id = $1
		RETURNING f.n >= $3`, id, LockoutWindow, LockoutFailures, LockoutDuration).Scan(&lockedNow)
	if err != nil {
		return fmt.Errorf("count failed login: %w", err)
	}
	if lockedNow {
		target["locked"] = true
	}
	return fail(reason)
}

// secondFactor checks a TOTP code (once per step) or a recovery code (once
// ever) and marks it used; it returns "totp" or "recovery-code", or "" when
// the code does not match.
func (s *Store) secondFactor(ctx context.Context, tx pgx.Tx, id int64, sealed, code string, lastStep int64) (string, error) {
	if isTOTPCode(code) {
		secret, err := s.opts.Keys.OpenString(colTOTP, userRow(id), sealed)
		if err != nil {
			return "", fmt.Errorf("open TOTP secret: %w", err)
		}
		step, ok := totpStep(secret, code, s.opts.Now(), lastStep)
		if !ok {
			return "", nil
		}
		if _, err := tx.Exec(ctx, `UPDATE mefor_user SET totp_last_step = $2 WHERE id = $1`, id, step); err != nil {
			return "", fmt.Errorf("record TOTP step: %w", err)
		}
		return "totp", nil
	}
	tag, err := tx.Exec(ctx, `UPDATE mefor_user_recovery_code SET used_at = now()
		WHERE user_id = $1 AND code_hash = $2 AND used_at IS NULL`, id, recoveryHash(code))
	if err != nil {
		return "", fmt.Errorf("use recovery code: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", nil
	}
	return "recovery-code", nil
}
