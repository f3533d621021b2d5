package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
)

// ErrNotSSOUser is a re-authentication through the identity provider asked
// for by a session whose user logs in with a password: they re-authenticate
// with their password and second factor instead.
var ErrNotSSOUser = errors.New("this session's user logs in with a password, not through single sign-on: " +
	"re-authenticate with POST /api/v1/reauth {password, totp}")

// authTimeSkew is how far in the future an ID token's auth_time may be:
// the provider's clock and this node's differ a little.
const authTimeSkew = time.Minute

// BeginSSOReauth records a re-authentication of session sessionID through
// the identity provider, from source, and returns its values as BeginSSO
// does. The session must be live (ErrUnauthenticated) and its user one who
// logs in through SSO (ErrNotSSOUser).
func (s *Store) BeginSSOReauth(ctx context.Context, sessionID int64, source string) (*SSOStart, error) {
	var sso bool
	err := s.db.QueryRow(ctx, `
		SELECT u.sso_subject IS NOT NULL FROM mefor_session s JOIN mefor_user u ON u.id = s.user_id
		WHERE s.id = $1 AND s.revoked_at IS NULL AND now() < s.expires_at`, sessionID).Scan(&sso)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrUnauthenticated
	case err != nil:
		return nil, fmt.Errorf("read session %d for SSO re-authentication: %w", sessionID, err)
	case !sso:
		return nil, ErrNotSSOUser
	}
	return s.beginSSO(ctx, source, SSOPurposeReauth, &sessionID)
}

// RefuseSSOReauth audits a refused re-authentication of p's session
// through the identity provider (action reauth, method sso) and returns
// the SSORefusedError the caller answers with.
func (s *Store) RefuseSSOReauth(ctx context.Context, p *SSOPending, source, reason, message string) error {
	target := map[string]any{"method": "sso", "source": source, "session_id": p.SessionID, "reason": reason}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := audit.AppendAlone(actx, s.db, audit.Entry{Action: audit.ActionReauth, Actor: p.Name, Outcome: audit.OutcomeFailed, Target: target}); err != nil {
		return fmt.Errorf("audit refused SSO re-authentication: %w", err)
	}
	return &SSORefusedError{Reason: reason, Message: message}
}

// SSOReauthIdentity is who a re-authentication's verified ID token says
// signed in again, and when.
type SSOReauthIdentity struct {
	Issuer, Subject string
	// AuthTime is the ID token's auth_time: when the provider last
	// authenticated the person. Zero when the token has none.
	AuthTime time.Time
	// AMR and RequireAMR are as in SSOIdentity.
	AMR, RequireAMR []string
	Source          string
}

// SSOReauth records on the session of p that its person signed in again at
// the identity provider. The ID token must name the session's user (issuer
// and subject), carry an auth_time (the flow asks for max_age=0, which makes
// it required) within ReauthWindow of Options.Now's clock, and, when the
// user's role requires MFA and RequireAMR is set, an amr naming one of
// RequireAMR. The session's reauth_at is the auth_time (never later than
// now): the window counts from when the person proved who they are, not
// from when the callback arrived. Every attempt is audited as action
// reauth, method sso; a refusal is an SSORefusedError, a session that ended
// meanwhile ErrUnauthenticated.
func (s *Store) SSOReauth(ctx context.Context, p *SSOPending, id SSOReauthIdentity) error {
	if !p.Reauth() || p.SessionID == 0 {
		return fmt.Errorf("SSO re-authentication of a flow started for %q", p.Purpose)
	}
	var (
		refused, words string
		ended          bool
	)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			name, roleName  string
			issuer, subject *string
			disabled        bool
		)
		err := tx.QueryRow(ctx, `
			SELECT u.name, u.role, u.sso_issuer, u.sso_subject, u.disabled
			FROM mefor_session s JOIN mefor_user u ON u.id = s.user_id
			WHERE s.id = $1 AND s.revoked_at IS NULL AND now() < s.expires_at FOR UPDATE OF s`, p.SessionID).
			Scan(&name, &roleName, &issuer, &subject, &disabled)
		if errors.Is(err, pgx.ErrNoRows) {
			ended = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("read session %d for SSO re-authentication: %w", p.SessionID, err)
		}
		now := s.opts.Now()
		age := now.Sub(id.AuthTime)
		switch {
		case disabled:
			refused, words = ReasonSSODisabled, "your mefor user is disabled; ask an administrator"
		case issuer == nil || subject == nil || *issuer != id.Issuer || *subject != id.Subject:
			refused, words = ReasonSSOSubject, "the identity provider signed in someone other than this session's user; "+
				"sign in at the provider as yourself, then start again at /api/v1/sso/reauth"
		case id.AuthTime.IsZero():
			refused, words = ReasonSSOAuthTime, "the identity provider did not say when you signed in (auth_time), "+
				"so mefor cannot tell that you just did; ask an administrator"
		case age > ReauthWindow || age < -authTimeSkew:
			refused, words = ReasonSSOAuthTime, fmt.Sprintf("the identity provider did not sign you in again just now "+
				"(auth_time is %s old, at most %s allowed); start again at /api/v1/sso/reauth", age.Round(time.Second), ReauthWindow)
		}
		if refused == "" && len(id.RequireAMR) > 0 {
			role, err := s.roles.lookup(roleName)
			if err != nil || (role.RequireMFA && !slices.ContainsFunc(id.AMR, func(m string) bool { return slices.Contains(id.RequireAMR, m) })) {
				refused, words = ReasonSSOMFA, fmt.Sprintf("your mefor role %s requires a second factor, and the identity provider "+
					"did not say it asked for one (amr %v, needs one of %v)", roleName, id.AMR, id.RequireAMR)
			}
		}
		if refused != "" {
			return nil
		}
		at := id.AuthTime
		if at.After(now) {
			at = now
		}
		if _, err := tx.Exec(ctx, `UPDATE mefor_session SET reauth_at = $2 WHERE id = $1`, p.SessionID, at); err != nil {
			return fmt.Errorf("record SSO re-authentication of session %d: %w", p.SessionID, err)
		}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionReauth, Actor: name, Target: map[string]any{
			"method": "sso", "source": id.Source, "session_id": p.SessionID, "issuer": id.Issuer, "subject": id.Subject,
			"auth_time": id.AuthTime.UTC(), "amr": id.AMR}})
	})
	switch {
	case err != nil:
		return err
	case ended:
		return ErrUnauthenticated
	case refused != "":
		return s.RefuseSSOReauth(ctx, p, id.Source, refused, words)
	}
	return nil
}
