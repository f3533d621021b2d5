package identity

import (
	"context"
	"crypto/rand"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/migrations"
)

// colTOTP is the sealed TOTP secret's column (part of its authenticated
// data).
const colTOTP crypt.Column = "mefor_user.totp_secret"

// userRow names a user's row in a sealed value's authenticated data, so a
// TOTP secret copied onto another user's row does not open there.
func userRow(id int64) crypt.Row { return crypt.Row("user " + strconv.FormatInt(id, 10)) }

// Lockout: LockoutFailures failed logins within LockoutWindow lock the
// account for LockoutDuration.
const (
	LockoutFailures = 5
	LockoutWindow   = 15 * time.Minute
	LockoutDuration = 15 * time.Minute
)

// Options configure a Store.
type Options struct {
	// Keys seal TOTP secrets. Defaults to nil: secrets are stored in
	// clear (docs/access.md says what that means).
	Keys *crypt.Keyring
	// Argon2 are the password hash's costs for new hashes. Defaults to
	// DefaultArgon2.
	Argon2 Argon2Params
	// SessionIdle ends a session unused this long. Defaults to 30m
	// (api.session_idle).
	SessionIdle time.Duration
	// SessionMax ends a session this long after login. Defaults to 12h
	// (api.session_max).
	SessionMax time.Duration
	// Roles are the custom roles (access.roles), besides the built-in
	// ones. Defaults to none.
	Roles map[string]Role
	// Groups map directory groups (access.groups) to a role and channels
	// for SSO logins. Defaults to none: every SSO login is refused.
	Groups map[string]GroupMapping
	// Now is the TOTP clock. Defaults to time.Now.
	Now func() time.Time
}

// Store reads and writes users, sessions and tokens. It is the only writer
// of their tables.
type Store struct {
	db    *pgxpool.Pool
	opts  Options
	roles roles

	dummyOnce sync.Once
	dummy     string
	// verify is VerifyPassword; tests count its calls.
	verify func(encoded, password string) (bool, error)
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Argon2 == (Argon2Params{}) {
		opts.Argon2 = DefaultArgon2
	}
	if opts.SessionIdle <= 0 {
		opts.SessionIdle = 30 * time.Minute
	}
	if opts.SessionMax <= 0 {
		opts.SessionMax = 12 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{db: pool, opts: opts, roles: opts.Roles, verify: VerifyPassword}
}

// dummyHash is a hash of a random password under the store's parameters:
// an unknown user's login is checked against it, so it takes as long as a
// known user's.
func (s *Store) dummyHash() string {
	s.dummyOnce.Do(func() {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		h, err := HashPassword(s.opts.Argon2, string(b))
		if err == nil {
			s.dummy = h
		}
	})
	return s.dummy
}

var nameForm = regexp.MustCompile(`^[a-z0-9][a-z0-9._@-]{0,63}$`)

func checkName(name string) error {
	if !nameForm.MatchString(name) {
		return &InvalidError{Field: "name", Reason: fmt.Sprintf("%q: a user name is 1 to 64 lowercase letters, digits, '.', '_', '@' or '-', starting with a letter or digit", name)}
	}
	return nil
}

// admin runs fn in a transaction of a member of mefor_admin, whose last
// statement appends the audit row of action on target; a failure is
// recorded in a transaction of its own, best effort. fn may add to target.
// A read (action "") is not recorded: it shows no credential.
func (s *Store) admin(ctx context.Context, action string, target map[string]any, fn func(tx pgx.Tx) error) error {
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := migrations.RequireRole(ctx, tx, migrations.RoleAdmin, "managing mefor's users and tokens"); err != nil {
			return err
		}
		if err := fn(tx); err != nil || action == "" {
			return err
		}
		return audit.Append(ctx, tx, audit.Entry{Action: action, Target: target})
	})
	if err != nil && action != "" {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = audit.AppendAlone(actx, s.db, audit.Failure(action, target, err))
	}
	return err
}
