package identity

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
)

// Token prefixes tell a session's token from an API token at a glance (and
// to secret scanners).
const (
	sessionPrefix = "mefor_s_"
	tokenPrefix   = "mefor_t_"
)

// newSecret draws a token: prefix and 32 random bytes, base64url.
func newSecret(prefix string) (string, []byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("draw a token: %w", err)
	}
	t := prefix + base64.RawURLEncoding.EncodeToString(b)
	return t, secretHash(t), nil
}

// secretHash is the stored form of a session or API token.
func secretHash(t string) []byte {
	h := sha256.Sum256([]byte(t))
	return h[:]
}

// Session is one login session, without its token.
type Session struct {
	ID          int64      `json:"id"`
	User        string     `json:"user"`
	Source      string     `json:"source"`
	CreatedAt   time.Time  `json:"created_at"`
	LastSeenAt  time.Time  `json:"last_seen_at"`
	IdleTimeout string     `json:"idle_timeout"`
	ExpiresAt   time.Time  `json:"expires_at"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
	// Active: not revoked, not expired, not idle too long.
	Active bool `json:"active"`
}

// createSession stores a new session of user id and returns its token.
func (s *Store) createSession(ctx context.Context, tx pgx.Tx, userID int64, source string) (int64, string, error) {
	token, hash, err := newSecret(sessionPrefix)
	if err != nil {
		return 0, "", err
	}
	var id int64
	err = tx.QueryRow(ctx, `
		INSERT INTO mefor_session (user_id, token_hash, source, idle_timeout, expires_at)
		VALUES ($1, $2, $3, $4, now() + $5::interval) RETURNING id`,
		userID, hash, source, s.opts.SessionIdle, s.opts.SessionMax).Scan(&id)
	if err != nil {
		return 0, "", fmt.Errorf("create session: %w", err)
	}
	return id, token, nil
}

// lastSeenEvery bounds how often a session's use is written: at most once
// this often, so a busy session does not write a row per request. The
// idle limit is exact to within it.
const lastSeenEvery = 30 * time.Second

// SessionPrincipal returns who a session token acts as, and notes its use.
// An unknown, revoked, expired or idle session, or one whose user is
// disabled, is ErrUnauthenticated.
func (s *Store) SessionPrincipal(ctx context.Context, token string) (*Principal, error) {
	if !strings.HasPrefix(token, sessionPrefix) {
		return nil, ErrUnauthenticated
	}
	p := &Principal{}
	var role string
	err := s.db.QueryRow(ctx, `
		WITH live AS (
			SELECT s.id, s.last_seen_at, u.id AS user_id, u.name, u.role, u.channels
			FROM mefor_session s JOIN mefor_user u ON u.id = s.user_id
			WHERE s.token_hash = $1 AND s.revoked_at IS NULL AND NOT u.disabled
			  AND now() < s.expires_at AND now() < s.last_seen_at + s.idle_timeout
		), seen AS (
			UPDATE mefor_session SET last_seen_at = now()
			WHERE id = (SELECT id FROM live) AND last_seen_at < now() - $2::interval
		)
		SELECT id, user_id, name, role, channels FROM live`, secretHash(token), lastSeenEvery).
		Scan(&p.SessionID, &p.UserID, &p.Name, &role, &p.Channels)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("look up session: %w", err)
	}
	p.Role = s.roleOf(role)
	return p, nil
}

// roleOf is the role a stored name stands for; a custom role no longer
// configured holds no permission.
func (s *Store) roleOf(name string) Role {
	r, err := s.roles.lookup(name)
	if err != nil {
		return Role{Name: name}
	}
	return r
}

// Logout revokes the session of token and records it, naming the user as
// actor. An unknown or ended session is ErrUnauthenticated.
func (s *Store) Logout(ctx context.Context, token, source string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var id int64
		var name string
		err := tx.QueryRow(ctx, `
			UPDATE mefor_session s SET revoked_at = now() FROM mefor_user u
			WHERE s.token_hash = $1 AND u.id = s.user_id AND s.revoked_at IS NULL
			RETURNING s.id, u.name`, secretHash(token)).Scan(&id, &name)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnauthenticated
		}
		if err != nil {
			return fmt.Errorf("log out: %w", err)
		}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionLogout, Actor: name,
			Target: map[string]any{"session_id": id, "source": source}})
	})
}

// Sessions lists a user's sessions, newest first.
func (s *Store) Sessions(ctx context.Context, name string) ([]Session, error) {
	var out []Session
	err := s.admin(ctx, "", nil, func(tx pgx.Tx) error {
		u, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT s.id, $2::text, s.source, s.created_at, s.last_seen_at, s.idle_timeout::text, s.expires_at, s.revoked_at,
				s.revoked_at IS NULL AND now() < s.expires_at AND now() < s.last_seen_at + s.idle_timeout
			FROM mefor_session s WHERE s.user_id = $1 ORDER BY s.id DESC`, u.ID, u.Name)
		if err != nil {
			return fmt.Errorf("list sessions of %s: %w", name, err)
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) {
			var x Session
			err := r.Scan(&x.ID, &x.User, &x.Source, &x.CreatedAt, &x.LastSeenAt, &x.IdleTimeout, &x.ExpiresAt, &x.RevokedAt, &x.Active)
			return x, err
		})
		if err != nil {
			return fmt.Errorf("list sessions of %s: %w", name, err)
		}
		return nil
	})
	return out, err
}

// RevokeSessions ends every open session of a user and returns how many.
func (s *Store) RevokeSessions(ctx context.Context, name string) (int64, error) {
	var n int64
	target := map[string]any{"user": name}
	err := s.admin(ctx, audit.ActionSessionsRevoke, target, func(tx pgx.Tx) error {
		u, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		n, err = revokeSessions(ctx, tx, u.ID)
		target["sessions_revoked"] = n
		return err
	})
	return n, err
}

func revokeSessions(ctx context.Context, tx pgx.Tx, userID int64) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE mefor_session SET revoked_at = now() WHERE user_id = $1 AND revoked_at IS NULL`, userID)
	if err != nil {
		return 0, fmt.Errorf("revoke sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}
