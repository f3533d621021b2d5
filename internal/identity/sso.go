package identity

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/audit"
)

// GroupMapping is what a directory group (access.groups) gives its
// members: a role, and the channels they see (none: every channel).
type GroupMapping struct {
	Role     string
	Channels []string
}

// SSOLoginTTL bounds a login under way: from GET /api/v1/sso/login to its
// callback. A person who takes longer starts again.
const SSOLoginTTL = 10 * time.Minute

// Reasons an SSO login was refused, recorded in its audit row.
const (
	ReasonSSOState        = "state"           // unknown or already used state: forged, or a replayed callback
	ReasonSSOBrowser      = "state-browser"   // the state was issued to another browser
	ReasonSSOExpired      = "state-expired"   // the login took longer than SSOLoginTTL
	ReasonSSOIdPError     = "idp-error"       // the identity provider answered an error
	ReasonSSOCode         = "code-exchange"   // the code was not exchanged for tokens
	ReasonSSOIDToken      = "id-token"        // no ID token, or one that does not verify
	ReasonSSONonce        = "nonce"           // the ID token was not issued for this login
	ReasonSSOName         = "name"            // no usable name in the ID token
	ReasonSSONoGroup      = "no-mapped-group" // none of the person's groups is in access.groups
	ReasonSSOAmbiguous    = "ambiguous-groups"
	ReasonSSONameTaken    = "name-taken" // the name belongs to another user (a password user, or another subject)
	ReasonSSODisabled     = "disabled"
	ReasonSSOMFA          = "mfa"       // the role requires MFA and the ID token's amr names none of require_amr
	ReasonSSOSubject      = "subject"   // a re-authentication's ID token names someone other than the session's user
	ReasonSSOAuthTime     = "auth-time" // a re-authentication's ID token has no auth_time, or one older than ReauthWindow
	reasonSSOPasswordUser = "sso-user"  // a password login to a user who logs in through SSO
)

// SSORefusedError is a refused SSO login. Reason is one of the Reason*
// constants, already audited; Message says what the person can do.
type SSORefusedError struct {
	Reason  string
	Message string
}

func (e *SSORefusedError) Error() string { return "single sign-on refused: " + e.Message }

// IsSSORefused reports whether err is an SSORefusedError, and returns it.
func IsSSORefused(err error) (*SSORefusedError, bool) {
	var r *SSORefusedError
	ok := errors.As(err, &r)
	return r, ok
}

// Forbidden reports whether the person was authenticated by the identity
// provider but is not let in (an API answers 403; otherwise 401).
func (e *SSORefusedError) Forbidden() bool {
	switch e.Reason {
	case ReasonSSONoGroup, ReasonSSOAmbiguous, ReasonSSONameTaken, ReasonSSODisabled, ReasonSSOName, ReasonSSOMFA, ReasonSSOSubject:
		return true
	}
	return false
}

// SSOStart is a login under way: State, Nonce and Verifier go to the
// identity provider (the verifier as its S256 challenge), Browser into
// the cookie of the browser that started it.
type SSOStart struct {
	State, Nonce, Verifier, Browser string
	ExpiresAt                       time.Time
}

// What a flow through the identity provider is for, stored with its state:
// a login opens a session, a re-authentication renews one.
const (
	SSOPurposeLogin  = "login"
	SSOPurposeReauth = "reauth"
)

// SSOPending is what the callback needs of its flow: the nonce the ID
// token must carry, the PKCE verifier, and what the flow is for. A
// re-authentication names its session and the session's user.
type SSOPending struct {
	Nonce, Verifier string
	// Purpose is SSOPurposeLogin or SSOPurposeReauth.
	Purpose string
	// SessionID and Name are the session a re-authentication renews and
	// its user's name; zero and "" for a login.
	SessionID int64
	Name      string
}

// Reauth reports whether the flow re-authenticates a session.
func (p *SSOPending) Reauth() bool { return p.Purpose == SSOPurposeReauth }

// Restart is the endpoint where the person starts this flow again.
func (p *SSOPending) Restart() string {
	if p.Reauth() {
		return "/api/v1/sso/reauth"
	}
	return "/api/v1/sso/login"
}

func random32() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("draw a random value: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// BeginSSO records a login under way from source and returns its values.
// Expired logins are deleted on the way.
func (s *Store) BeginSSO(ctx context.Context, source string) (*SSOStart, error) {
	return s.beginSSO(ctx, source, SSOPurposeLogin, nil)
}

// beginSSO records a flow of purpose under way; sessionID names the session
// a re-authentication renews (nil for a login).
func (s *Store) beginSSO(ctx context.Context, source, purpose string, sessionID *int64) (*SSOStart, error) {
	st := &SSOStart{}
	for _, v := range []*string{&st.State, &st.Nonce, &st.Verifier, &st.Browser} {
		var err error
		if *v, err = random32(); err != nil {
			return nil, err
		}
	}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM mefor_sso_login WHERE expires_at < now()`); err != nil {
			return fmt.Errorf("drop expired SSO logins: %w", err)
		}
		return tx.QueryRow(ctx, `
			INSERT INTO mefor_sso_login (state_hash, browser_hash, nonce, verifier, source, expires_at, purpose, session_id)
			VALUES ($1, $2, $3, $4, $5, now() + $6::interval, $7, $8) RETURNING expires_at`,
			secretHash(st.State), secretHash(st.Browser), st.Nonce, st.Verifier, source, SSOLoginTTL, purpose, sessionID).Scan(&st.ExpiresAt)
	})
	if err != nil {
		return nil, fmt.Errorf("begin SSO %s: %w", purpose, err)
	}
	return st, nil
}

// ResumeSSO takes the login of state back, once: its row is deleted
// whatever follows, so a replayed callback finds nothing. It is refused
// (and audited) when the state is unknown or used, was issued to a browser
// other than the one holding browser, or expired.
func (s *Store) ResumeSSO(ctx context.Context, state, browser, source string) (*SSOPending, error) {
	var (
		p            SSOPending
		browserHash  []byte
		expired      bool
		refusedWhy   string
		refusedWords string
	)
	var sessionID *int64
	err := s.db.QueryRow(ctx, `
		WITH used AS (
			DELETE FROM mefor_sso_login WHERE state_hash = $1
			RETURNING browser_hash, nonce, verifier, expires_at < now() AS expired, purpose, session_id)
		SELECT used.browser_hash, used.nonce, used.verifier, used.expired, used.purpose, used.session_id, coalesce(u.name, '')
		FROM used LEFT JOIN mefor_session s ON s.id = used.session_id LEFT JOIN mefor_user u ON u.id = s.user_id`, secretHash(state)).
		Scan(&browserHash, &p.Nonce, &p.Verifier, &expired, &p.Purpose, &sessionID, &p.Name)
	if sessionID != nil {
		p.SessionID = *sessionID
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		refusedWhy, refusedWords = ReasonSSOState, "this sign-in is unknown or was already used; start again at /api/v1/sso/login"
	case err != nil:
		return nil, fmt.Errorf("resume SSO login: %w", err)
	case subtle.ConstantTimeCompare(browserHash, secretHash(browser)) != 1:
		refusedWhy, refusedWords = ReasonSSOBrowser, "this sign-in was started in another browser; start again at "+p.Restart()
	case expired:
		refusedWhy, refusedWords = ReasonSSOExpired, fmt.Sprintf("this sign-in took longer than %s; start again at %s", SSOLoginTTL, p.Restart())
	}
	if refusedWhy != "" {
		if p.Reauth() {
			return nil, s.RefuseSSOReauth(ctx, &p, source, refusedWhy, refusedWords)
		}
		return nil, s.RefuseSSO(ctx, "", source, refusedWhy, refusedWords)
	}
	return &p, nil
}

// RefuseSSO audits a refused SSO login of name ("" when no ID token named
// anyone yet) from source and returns the SSORefusedError the caller
// answers with.
func (s *Store) RefuseSSO(ctx context.Context, name, source, reason, message string) error {
	target := map[string]any{"method": "sso", "source": source, "reason": reason}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := audit.AppendAlone(actx, s.db, audit.Entry{Action: audit.ActionLogin, Actor: name, Outcome: audit.OutcomeFailed, Target: target}); err != nil {
		return fmt.Errorf("audit refused SSO login: %w", err)
	}
	return &SSORefusedError{Reason: reason, Message: message}
}

// SSOIdentity is who an ID token says logged in.
type SSOIdentity struct {
	Issuer, Subject string
	// Name is the mefor user name: the preferred_username claim, or email
	// without it, lowercased.
	Name   string
	Groups []string
	Source string
	// AMR is the ID token's amr claim: how the provider authenticated
	// the person (pwd, mfa, otp, ...).
	AMR []string
	// RequireAMR, when set, lets a person whose role requires MFA in only
	// when AMR holds one of these (api.sso.oidc.require_amr). Defaults to
	// none: MFA is left to the provider's policy.
	RequireAMR []string
}

// mapGroups gives the role and channels of groups: every mapped group
// must name the same role (a person in groups of different roles is
// refused rather than guessed at), and the channels are the union of the
// groups' (a group without channels sees every channel, so then does the
// person).
func (s *Store) mapGroups(groups []string) (Role, []string, string) {
	var (
		role     string
		channels []string
		all      bool
		mapped   []string
	)
	for _, g := range groups {
		m, ok := s.opts.Groups[g]
		if !ok {
			continue
		}
		mapped = append(mapped, g)
		if role != "" && m.Role != role {
			return Role{}, nil, ReasonSSOAmbiguous
		}
		role = m.Role
		if len(m.Channels) == 0 {
			all = true
		}
		channels = append(channels, m.Channels...)
	}
	if role == "" {
		return Role{}, nil, ReasonSSONoGroup
	}
	r, err := s.roles.lookup(role)
	if err != nil {
		// Config validation refuses this; a role removed since is no role.
		return Role{}, nil, ReasonSSONoGroup
	}
	if all {
		return r, []string{}, ""
	}
	sort.Strings(channels)
	return r, slices.Compact(channels), ""
}

// SSOLogin lets in a person the identity provider authenticated: their
// groups give their role and channels (re-derived at every login, and
// applied at once to their open sessions, which read them from their user
// row), their user row is created or updated, and a session opened. A
// refusal is an audited SSORefusedError.
func (s *Store) SSOLogin(ctx context.Context, id SSOIdentity) (*Login, error) {
	name := strings.ToLower(strings.TrimSpace(id.Name))
	if !nameForm.MatchString(name) {
		return nil, s.RefuseSSO(ctx, "", id.Source, ReasonSSOName,
			"the identity provider gave no user name mefor can use (preferred_username or email: 1 to 64 letters, digits, '.', '_', '@' or '-')")
	}
	role, channels, why := s.mapGroups(id.Groups)
	switch why {
	case ReasonSSONoGroup:
		return nil, s.RefuseSSO(ctx, name, id.Source, why, "none of your directory groups is given access to mefor; ask an administrator")
	case ReasonSSOAmbiguous:
		return nil, s.RefuseSSO(ctx, name, id.Source, why,
			"your directory groups give different mefor roles; an administrator must map you through one role")
	}
	if role.RequireMFA && len(id.RequireAMR) > 0 && !slices.ContainsFunc(id.AMR, func(m string) bool { return slices.Contains(id.RequireAMR, m) }) {
		return nil, s.RefuseSSO(ctx, name, id.Source, ReasonSSOMFA, fmt.Sprintf(
			"your mefor role %s requires a second factor, and the identity provider did not say it asked for one (amr %v, needs one of %v)",
			role.Name, id.AMR, id.RequireAMR))
	}
	var out *Login
	refused := ""
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			uid      int64
			old      string
			disabled bool
		)
		err := tx.QueryRow(ctx, `SELECT id, name, disabled FROM mefor_user WHERE sso_issuer = $1 AND sso_subject = $2 FOR UPDATE`,
			id.Issuer, id.Subject).Scan(&uid, &old, &disabled)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = tx.QueryRow(ctx, `INSERT INTO mefor_user (name, role, channels, sso_issuer, sso_subject)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING RETURNING id`,
				name, role.Name, channels, id.Issuer, id.Subject).Scan(&uid)
			if errors.Is(err, pgx.ErrNoRows) {
				refused = ReasonSSONameTaken
				return nil
			}
			if err != nil {
				return fmt.Errorf("add SSO user %s: %w", name, err)
			}
		case err != nil:
			return fmt.Errorf("read SSO user %s: %w", name, err)
		case disabled:
			refused = ReasonSSODisabled
			return nil
		default:
			_, err := tx.Exec(ctx, `UPDATE mefor_user SET name = $2, role = $3, channels = $4,
				updated_at = CASE WHEN (name, role, channels) IS DISTINCT FROM ($2, $3, $4) THEN now() ELSE updated_at END
				WHERE id = $1`, uid, name, role.Name, channels)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				refused = ReasonSSONameTaken
				return nil
			}
			if err != nil {
				return fmt.Errorf("update SSO user %s: %w", name, err)
			}
		}
		sid, token, err := s.createSession(ctx, tx, uid, id.Source)
		if err != nil {
			return err
		}
		var expires time.Time
		if err := tx.QueryRow(ctx, `SELECT expires_at FROM mefor_session WHERE id = $1`, sid).Scan(&expires); err != nil {
			return fmt.Errorf("read session: %w", err)
		}
		out = &Login{Token: token, ExpiresAt: expires,
			Principal: &Principal{UserID: uid, Name: name, Role: role, Channels: channels, SessionID: sid}}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionLogin, Actor: name, Target: map[string]any{
			"method": "sso", "source": id.Source, "session_id": sid, "role": role.Name, "channels": channels,
			"issuer": id.Issuer, "subject": id.Subject}})
	})
	if err != nil {
		return nil, err
	}
	switch refused {
	case ReasonSSONameTaken:
		return nil, s.RefuseSSO(ctx, name, id.Source, refused,
			"the user name "+name+" belongs to another mefor user; an administrator must rename or delete that user")
	case ReasonSSODisabled:
		return nil, s.RefuseSSO(ctx, name, id.Source, refused, "your mefor user is disabled; ask an administrator")
	}
	return out, nil
}
