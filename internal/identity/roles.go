package identity

import (
	"fmt"
	"path"
	"slices"
	"sort"
)

// Permission is one thing a role may do. The list is the contract custom
// roles (access.roles) are written against; docs/access.md lists it.
type Permission string

// The permissions.
const (
	PermStatus         Permission = "status"          // cluster status and counts
	PermNodes          Permission = "nodes"           // the node list
	PermMessagesRead   Permission = "messages.read"   // message metadata, stages and timelines
	PermDeadRead       Permission = "dead.read"       // the dead-letter list
	PermAlertsRead     Permission = "alerts.read"     // alert states
	PermMessagesBody   Permission = "messages.body"   // message content, text and patient search
	PermReplay         Permission = "replay"          // replay one message
	PermReplayDead     Permission = "replay-dead"     // re-queue dead letters in bulk
	PermCancel         Permission = "cancel"          // cancel pending deliveries
	PermEnqueue        Permission = "enqueue"         // store a message as a listener would
	PermStepdown       Permission = "stepdown"        // planned failover
	PermReload         Permission = "reload"          // reload the cluster's config
	PermMaintenanceRun Permission = "maintenance.run" // run a maintenance job now
	PermKeysStatus     Permission = "keys.status"     // values under each encryption key
	PermKeysRotate     Permission = "keys.rotate"     // re-encrypt under the active key
	PermAuditRead      Permission = "audit.read"      // the audit log
	PermUsers          Permission = "users"           // add, change, disable and delete users, their sessions and MFA
	PermTokens         Permission = "tokens"          // create, list and revoke API tokens
)

// Permissions lists every permission, in the order docs/access.md does.
var Permissions = []Permission{
	PermStatus, PermNodes, PermMessagesRead, PermDeadRead, PermAlertsRead,
	PermMessagesBody, PermReplay, PermReplayDead, PermCancel, PermEnqueue,
	PermStepdown, PermReload, PermMaintenanceRun, PermKeysStatus, PermKeysRotate, PermAuditRead, PermUsers, PermTokens,
}

// Role is a named set of permissions.
type Role struct {
	Name        string       `json:"name"`
	Permissions []Permission `json:"permissions"`
	// RequireMFA makes its users log in with a TOTP code. Always true
	// for admin.
	RequireMFA bool `json:"require_mfa"`
}

// Has reports whether the role holds p.
func (r Role) Has(p Permission) bool { return slices.Contains(r.Permissions, p) }

// The built-in roles.
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
	RoleAdmin    = "admin"
)

var (
	viewerPerms   = []Permission{PermStatus, PermNodes, PermMessagesRead, PermDeadRead, PermAlertsRead}
	operatorPerms = append(slices.Clone(viewerPerms), PermMessagesBody, PermReplay, PermReplayDead, PermCancel, PermEnqueue)
)

// BuiltinRoles are viewer (status, nodes, message metadata and timelines,
// dead letters, alerts; no content), operator (viewer, plus message
// bodies, replay, replay-dead, cancel, enqueue) and admin (everything; it
// always requires MFA).
var BuiltinRoles = map[string]Role{
	RoleViewer:   {Name: RoleViewer, Permissions: viewerPerms},
	RoleOperator: {Name: RoleOperator, Permissions: operatorPerms},
	RoleAdmin:    {Name: RoleAdmin, Permissions: slices.Clone(Permissions), RequireMFA: true},
}

// grantsAccess are the permissions that let their holder give anyone,
// themselves included, any role or a credential acting as any user: a role
// holding one is as strong as admin, so it requires MFA as admin does.
var grantsAccess = []Permission{PermUsers, PermTokens}

// AdminEquivalent reports whether permissions include one that grants
// access (users, tokens): a custom role holding one must require MFA.
func AdminEquivalent(permissions []Permission) bool {
	return slices.ContainsFunc(permissions, func(p Permission) bool { return slices.Contains(grantsAccess, p) })
}

// NewRole checks a custom role (access.roles): a name that is not a
// built-in's, known permissions only, and MFA required when the role is
// admin-equivalent (AdminEquivalent).
func NewRole(name string, permissions []string, requireMFA bool) (Role, error) {
	if _, ok := BuiltinRoles[name]; ok {
		return Role{}, &InvalidError{Field: "role", Reason: fmt.Sprintf("%s is a built-in role", name)}
	}
	if !nameForm.MatchString(name) {
		return Role{}, &InvalidError{Field: "role", Reason: fmt.Sprintf("%q: a role name is 1 to 64 lowercase letters, digits, '.', '_', '@' or '-'", name)}
	}
	r := Role{Name: name, RequireMFA: requireMFA}
	for _, p := range permissions {
		if !slices.Contains(Permissions, Permission(p)) {
			return Role{}, &InvalidError{Field: "permissions", Reason: fmt.Sprintf("role %s: unknown permission %q (known: %v)", name, p, Permissions)}
		}
		r.Permissions = append(r.Permissions, Permission(p))
	}
	if !requireMFA && AdminEquivalent(r.Permissions) {
		return Role{}, &InvalidError{Field: "require_mfa", Reason: fmt.Sprintf("role %s holds %v, which can give anyone any role, so it requires MFA as admin does; "+
			"remove require_mfa: false (or those permissions)", name, grantsAccess)}
	}
	return r, nil
}

// roles is the built-in roles and custom ones.
type roles map[string]Role

func (rs roles) lookup(name string) (Role, error) {
	if r, ok := BuiltinRoles[name]; ok {
		return r, nil
	}
	if r, ok := rs[name]; ok {
		return r, nil
	}
	known := make([]string, 0, len(BuiltinRoles)+len(rs))
	for n := range BuiltinRoles {
		known = append(known, n)
	}
	for n := range rs {
		known = append(known, n)
	}
	sort.Strings(known)
	return Role{}, &InvalidError{Field: "role", Reason: fmt.Sprintf("unknown role %q (known: %v)", name, known)}
}

// checkChannels refuses a pattern path.Match cannot read.
func checkChannels(patterns []string) error {
	for _, p := range patterns {
		if p == "" {
			return &InvalidError{Field: "channel", Reason: "empty channel pattern"}
		}
		if _, err := path.Match(p, ""); err != nil {
			return &InvalidError{Field: "channel", Reason: fmt.Sprintf("pattern %q: %v", p, err)}
		}
	}
	return nil
}

// Principal is who a request acts as: a user, through a session or a token.
type Principal struct {
	UserID   int64    `json:"user_id"`
	Name     string   `json:"name"`
	Role     Role     `json:"role"`
	Channels []string `json:"channels"`
	// SessionID or TokenID says how the request authenticated (audit rows
	// name it).
	SessionID int64 `json:"session_id,omitempty"`
	TokenID   int64 `json:"token_id,omitempty"`
}

// Can reports whether the principal's role holds p.
func (p *Principal) Can(perm Permission) bool { return p.Role.Has(perm) }

// SeesChannel reports whether channel is in the principal's scope: every
// channel when it holds no pattern.
func (p *Principal) SeesChannel(channel string) bool {
	if len(p.Channels) == 0 {
		return true
	}
	for _, pat := range p.Channels {
		if ok, _ := path.Match(pat, channel); ok {
			return true
		}
	}
	return false
}
