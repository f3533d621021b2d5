package identity

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/audit"
)

// Token is an API token, without its secret.
type Token struct {
	ID         int64      `json:"id"`
	User       string     `json:"user"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

const tokenColumns = `t.id, u.name, t.created_at, t.expires_at, t.last_used_at, t.revoked_at`

func scanToken(r pgx.Row) (Token, error) {
	var t Token
	err := r.Scan(&t.ID, &t.User, &t.CreatedAt, &t.ExpiresAt, &t.LastUsedAt, &t.RevokedAt)
	return t, err
}

// CreateToken makes an API token acting as user name, valid for ttl (0:
// until revoked). It returns the token's secret, which is stored only as
// its SHA-256 and cannot be shown again.
func (s *Store) CreateToken(ctx context.Context, name string, ttl time.Duration) (Token, string, error) {
	if ttl < 0 {
		return Token{}, "", &InvalidError{Field: "expires", Reason: "must not be negative"}
	}
	var tok Token
	var secret string
	target := map[string]any{"user": name}
	if ttl > 0 {
		target["expires_in"] = ttl.String()
	}
	err := s.admin(ctx, audit.ActionTokenCreate, target, func(tx pgx.Tx) error {
		u, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		var hash []byte
		secret, hash, err = newSecret(tokenPrefix)
		if err != nil {
			return err
		}
		var expires *time.Duration
		if ttl > 0 {
			expires = &ttl
		}
		tok, err = scanToken(tx.QueryRow(ctx, `
			WITH t AS (
				INSERT INTO mefor_api_token (user_id, token_hash, expires_at) VALUES ($1, $2, now() + $3::interval)
				RETURNING *
			) SELECT `+tokenColumns+` FROM t JOIN mefor_user u ON u.id = t.user_id`, u.ID, hash, expires))
		if err != nil {
			return fmt.Errorf("create token for %s: %w", name, err)
		}
		target["token_id"] = tok.ID
		return nil
	})
	if err != nil {
		return Token{}, "", err
	}
	return tok, secret, nil
}

// ListTokens lists every API token, newest first.
func (s *Store) ListTokens(ctx context.Context) ([]Token, error) {
	var out []Token
	err := s.admin(ctx, "", nil, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+tokenColumns+` FROM mefor_api_token t JOIN mefor_user u ON u.id = t.user_id ORDER BY t.id DESC`)
		if err != nil {
			return fmt.Errorf("list tokens: %w", err)
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) { return scanToken(r) })
		if err != nil {
			return fmt.Errorf("list tokens: %w", err)
		}
		return nil
	})
	return out, err
}

// RevokeToken revokes token id; it is refused from then on.
func (s *Store) RevokeToken(ctx context.Context, id int64) error {
	return s.admin(ctx, audit.ActionTokenRevoke, map[string]any{"token_id": id}, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE mefor_api_token SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1`, id)
		if err != nil {
			return fmt.Errorf("revoke token %d: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			return &NotFoundError{Kind: "token", Name: strconv.FormatInt(id, 10)}
		}
		return nil
	})
}

// TokenPrincipal returns who an API token acts as. An unknown, revoked or
// expired token, or one whose user is disabled, is ErrUnauthenticated.
func (s *Store) TokenPrincipal(ctx context.Context, token string) (*Principal, error) {
	if !strings.HasPrefix(token, tokenPrefix) {
		return nil, ErrUnauthenticated
	}
	p := &Principal{}
	var role string
	err := s.db.QueryRow(ctx, `
		WITH live AS (
			SELECT t.id, u.id AS user_id, u.name, u.role, u.channels
			FROM mefor_api_token t JOIN mefor_user u ON u.id = t.user_id
			WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND NOT u.disabled
			  AND (t.expires_at IS NULL OR now() < t.expires_at)
		), used AS (
			UPDATE mefor_api_token SET last_used_at = now()
			WHERE id = (SELECT id FROM live) AND (last_used_at IS NULL OR last_used_at < now() - $2::interval)
		)
		SELECT id, user_id, name, role, channels FROM live`, secretHash(token), lastSeenEvery).
		Scan(&p.TokenID, &p.UserID, &p.Name, &role, &p.Channels)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("look up token: %w", err)
	}
	p.Role = s.roleOf(role)
	return p, nil
}

// ParseExpiry reads a token's lifetime as `token create --expires` and
// POST /api/v1/tokens take it: a duration (12h), days (90d), or never (0,
// until revoked). A bad value is an InvalidError naming field expires.
func ParseExpiry(s string) (time.Duration, error) {
	if s == "never" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d, nil
	}
	return 0, &InvalidError{Field: "expires", Reason: fmt.Sprintf("%q: give a duration such as 90d or 12h, or never", s)}
}
