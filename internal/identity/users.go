package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/audit"
)

// User is one person's account, without its credentials.
type User struct {
	ID       int64    `json:"id"`
	Name     string   `json:"name"`
	Role     string   `json:"role"`
	Channels []string `json:"channels"`
	Disabled bool     `json:"disabled"`
	// MFA says the user has a TOTP second factor enrolled.
	MFA bool `json:"mfa"`
	// SSO says the user logs in through the OpenID Connect provider (no
	// password; their role and channels follow their directory groups at
	// each login, and their MFA is the provider's).
	SSO         bool       `json:"sso"`
	LockedUntil *time.Time `json:"locked_until,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
}

const userColumns = `id, name, role, channels, disabled, totp_secret IS NOT NULL, sso_subject IS NOT NULL,
	CASE WHEN locked_until > now() THEN locked_until END, created_at, updated_at`

func scanUser(row pgx.Row) (User, error) {
	var u User
	err := row.Scan(&u.ID, &u.Name, &u.Role, &u.Channels, &u.Disabled, &u.MFA, &u.SSO, &u.LockedUntil, &u.CreatedAt, &u.UpdatedAt)
	if u.Channels == nil {
		u.Channels = []string{}
	}
	return u, err
}

// NewUser is what AddUser needs.
type NewUser struct {
	Name     string
	Role     string
	Channels []string
	// Password is checked by CheckPassword and stored hashed; it is never
	// logged or recorded.
	Password string
}

// AddUser creates a user. For a role that requires MFA it enrolls a TOTP
// second factor and returns the enrollment, to be shown once.
func (s *Store) AddUser(ctx context.Context, n NewUser) (User, *Enrollment, error) {
	if err := checkName(n.Name); err != nil {
		return User{}, nil, err
	}
	role, err := s.roles.lookup(n.Role)
	if err != nil {
		return User{}, nil, err
	}
	if err := checkChannels(n.Channels); err != nil {
		return User{}, nil, err
	}
	if err := CheckPassword(n.Name, n.Password); err != nil {
		return User{}, nil, err
	}
	hash, err := HashPassword(s.opts.Argon2, n.Password)
	if err != nil {
		return User{}, nil, err
	}
	channels := n.Channels
	if channels == nil {
		channels = []string{}
	}
	var u User
	var enr *Enrollment
	target := map[string]any{"user": n.Name, "role": n.Role, "channels": channels}
	err = s.admin(ctx, audit.ActionUserAdd, target, func(tx pgx.Tx) error {
		u, err = scanUser(tx.QueryRow(ctx, `
			INSERT INTO mefor_user (name, role, channels, password_hash) VALUES ($1, $2, $3, $4)
			RETURNING `+userColumns, n.Name, n.Role, channels, hash))
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				return &InvalidError{Field: "name", Reason: fmt.Sprintf("user %s already exists", n.Name)}
			}
			return fmt.Errorf("add user %s: %w", n.Name, err)
		}
		if role.RequireMFA {
			if enr, err = s.enroll(ctx, tx, u.ID, u.Name); err != nil {
				return err
			}
			u.MFA = true
			target["mfa"] = true
		}
		return nil
	})
	if err != nil {
		return User{}, nil, err
	}
	return u, enr, nil
}

// enroll gives user id a new TOTP secret and new recovery codes, replacing
// any it had, and returns them.
func (s *Store) enroll(ctx context.Context, tx pgx.Tx, id int64, name string) (*Enrollment, error) {
	secret, uri, err := newTOTP(name)
	if err != nil {
		return nil, err
	}
	codes, hashes, err := newRecoveryCodes()
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE mefor_user SET totp_secret = $2, totp_last_step = 0, updated_at = now() WHERE id = $1`,
		id, s.opts.Keys.SealString(colTOTP, userRow(id), secret)); err != nil {
		return nil, fmt.Errorf("store TOTP secret of %s: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM mefor_user_recovery_code WHERE user_id = $1`, id); err != nil {
		return nil, fmt.Errorf("drop recovery codes of %s: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mefor_user_recovery_code (user_id, code_hash) SELECT $1, unnest($2::text[])`,
		id, hashes); err != nil {
		return nil, fmt.Errorf("store recovery codes of %s: %w", name, err)
	}
	return &Enrollment{TOTPURI: uri, RecoveryCodes: codes}, nil
}

// ListUsers returns every user, by name.
func (s *Store) ListUsers(ctx context.Context) ([]User, error) {
	var out []User
	err := s.admin(ctx, "", nil, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+userColumns+` FROM mefor_user ORDER BY name`)
		if err != nil {
			return fmt.Errorf("list users: %w", err)
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (User, error) { return scanUser(r) })
		if err != nil {
			return fmt.Errorf("list users: %w", err)
		}
		return nil
	})
	return out, err
}

// lockUser reads and locks user name's row.
func lockUser(ctx context.Context, tx pgx.Tx, name string) (User, error) {
	u, err := scanUser(tx.QueryRow(ctx, `SELECT `+userColumns+` FROM mefor_user WHERE name = $1 FOR UPDATE`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return User{}, &NotFoundError{Kind: "user", Name: name}
	}
	if err != nil {
		return User{}, fmt.Errorf("read user %s: %w", name, err)
	}
	return u, nil
}

// Change is what SetUser changes; nil fields stay.
type Change struct {
	Role     *string
	Channels *[]string
}

// SetUser changes a user's role or channels and ends their sessions, so
// no session keeps rights the user no longer has. A new role that
// requires MFA, for a user without a second factor, enrolls one and
// returns it.
func (s *Store) SetUser(ctx context.Context, name string, c Change) (User, *Enrollment, error) {
	var role Role
	if c.Role != nil {
		var err error
		if role, err = s.roles.lookup(*c.Role); err != nil {
			return User{}, nil, err
		}
	}
	if c.Channels != nil {
		if err := checkChannels(*c.Channels); err != nil {
			return User{}, nil, err
		}
	}
	var u User
	var enr *Enrollment
	target := map[string]any{"user": name}
	err := s.admin(ctx, audit.ActionUserSet, target, func(tx pgx.Tx) error {
		before, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		newRole, channels := before.Role, before.Channels
		if c.Role != nil {
			newRole = *c.Role
			target["role"] = newRole
		}
		if c.Channels != nil {
			channels = slices.Clone(*c.Channels)
			if channels == nil {
				channels = []string{}
			}
			target["channels"] = channels
		}
		u, err = scanUser(tx.QueryRow(ctx, `UPDATE mefor_user SET role = $2, channels = $3, updated_at = now() WHERE id = $1
			RETURNING `+userColumns, before.ID, newRole, channels))
		if err != nil {
			return fmt.Errorf("set user %s: %w", name, err)
		}
		if c.Role != nil && role.RequireMFA && !u.MFA {
			if enr, err = s.enroll(ctx, tx, u.ID, u.Name); err != nil {
				return err
			}
			u.MFA = true
			target["mfa"] = "enrolled"
		}
		n, err := revokeSessions(ctx, tx, u.ID)
		target["sessions_revoked"] = n
		return err
	})
	if err != nil {
		return User{}, nil, err
	}
	return u, enr, nil
}

// SetDisabled disables (ending the user's sessions; their tokens are
// refused while disabled) or enables a user.
func (s *Store) SetDisabled(ctx context.Context, name string, disabled bool) (User, error) {
	action := audit.ActionUserEnable
	if disabled {
		action = audit.ActionUserDisable
	}
	var u User
	target := map[string]any{"user": name}
	err := s.admin(ctx, action, target, func(tx pgx.Tx) error {
		before, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		// Enabling also clears a lockout: an administrator vouched.
		u, err = scanUser(tx.QueryRow(ctx, `UPDATE mefor_user SET disabled = $2, updated_at = now(),
				failed_count = CASE WHEN $2 THEN failed_count ELSE 0 END,
				failed_since = CASE WHEN $2 THEN failed_since END,
				locked_until = CASE WHEN $2 THEN locked_until END
			WHERE id = $1 RETURNING `+userColumns, before.ID, disabled))
		if err != nil {
			return fmt.Errorf("set user %s disabled=%v: %w", name, disabled, err)
		}
		if disabled {
			n, err := revokeSessions(ctx, tx, u.ID)
			target["sessions_revoked"] = n
			return err
		}
		return nil
	})
	return u, err
}

// DeleteUser deletes a user with their sessions, tokens and recovery
// codes. The audit log keeps naming them.
func (s *Store) DeleteUser(ctx context.Context, name string) error {
	return s.admin(ctx, audit.ActionUserDelete, map[string]any{"user": name}, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM mefor_user WHERE name = $1`, name)
		if err != nil {
			return fmt.Errorf("delete user %s: %w", name, err)
		}
		if tag.RowsAffected() == 0 {
			return &NotFoundError{Kind: "user", Name: name}
		}
		return nil
	})
}

// ResetMFA gives a user a new TOTP secret and new recovery codes; the old
// ones stop working at once.
func (s *Store) ResetMFA(ctx context.Context, name string) (*Enrollment, error) {
	var enr *Enrollment
	err := s.admin(ctx, audit.ActionUserResetMFA, map[string]any{"user": name}, func(tx pgx.Tx) error {
		u, err := lockUser(ctx, tx, name)
		if err != nil {
			return err
		}
		enr, err = s.enroll(ctx, tx, u.ID, u.Name)
		return err
	})
	return enr, err
}
