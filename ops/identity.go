package ops

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/identity"
)

// mefor's people, as ops returns them (package identity owns them).
type (
	// UserStore adds, changes and lists users, their sessions and API
	// tokens; every change is audited.
	UserStore = identity.Store
	// User is one person's account, without its credentials.
	User = identity.User
	// NewUser is what UserStore.AddUser needs.
	NewUser = identity.NewUser
	// UserChange is what UserStore.SetUser changes.
	UserChange = identity.Change
	// Enrollment is a second factor to show once: the otpauth:// URI and
	// the recovery codes.
	Enrollment = identity.Enrollment
	// Session is one login session, without its token.
	Session = identity.Session
	// APIToken is an API token, without its secret.
	APIToken = identity.Token
	// Role is a named set of permissions, built in or custom.
	Role = identity.Role
)

// Users returns the store of mefor's users on pool, sealing TOTP secrets
// under kr (nil: stored in clear, see docs/access.md).
func Users(pool *pgxpool.Pool, kr *crypt.Keyring) *UserStore {
	return identity.New(pool, identity.Options{Keys: kr})
}

// UsersWithRoles is Users that also knows the custom roles of a config's
// access.roles, so users may be given them.
func UsersWithRoles(pool *pgxpool.Pool, kr *crypt.Keyring, roles map[string]identity.Role) *UserStore {
	return identity.New(pool, identity.Options{Keys: kr, Roles: roles})
}

// UserRoles lists the built-in roles' names, least privileged first.
func UserRoles() []string {
	return []string{identity.RoleViewer, identity.RoleOperator, identity.RoleAdmin}
}

// IsNotFound reports whether err is a user or token that does not exist.
func IsNotFound(err error) bool { return identity.IsNotFound(err) }

// ParseTokenExpiry reads a token's lifetime: a duration (12h), days (90d),
// or never (0).
func ParseTokenExpiry(s string) (time.Duration, error) { return identity.ParseExpiry(s) }
