package config

import (
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/identity"
)

// Access is the file's access: section: who may do what through the API
// beyond the built-in roles (docs/access.md). Empty without the section.
type Access struct {
	// Roles are the custom roles by name, each a set of identity's
	// permissions, besides viewer, operator and admin. Defaults to none.
	Roles map[string]identity.Role
	// Groups map a directory group, as the ID token's groups claim names
	// it, to the role and channels its members get at an SSO login.
	// Defaults to none.
	Groups map[string]identity.GroupMapping
	// Approvals puts actions under dual control; nil without
	// access.approvals.
	Approvals *Approvals
}

// RoleNames lists the roles a user may hold under this file: the
// built-in ones and the custom ones, sorted.
func (a Access) RoleNames() []string {
	out := make([]string, 0, len(identity.BuiltinRoles)+len(a.Roles))
	for n := range identity.BuiltinRoles {
		out = append(out, n)
	}
	for n := range a.Roles {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// hasRole reports whether name is a built-in or custom role.
func (a Access) hasRole(name string) bool {
	_, builtin := identity.BuiltinRoles[name]
	_, custom := a.Roles[name]
	return builtin || custom
}

func (l *loader) decodeAccess(n *yaml.Node, p path) Access {
	a := Access{}
	m := l.mapping(n, p, "roles", "groups", "approvals")
	if an, ok := m["approvals"]; ok {
		a.Approvals = l.decodeApprovals(an, p.key("approvals"))
	}
	l.entities(m["roles"], p.key("roles"), func(name string, n *yaml.Node, rp path) {
		rm := l.mapping(n, rp, "permissions", "require_mfa")
		var perms []string
		l.strings(rm, rp, "permissions", &perms)
		if _, ok := rm["permissions"]; !ok {
			l.errorf(rp.key("permissions"), "is required: what the role may do, from %s (e.g. permissions: [status, messages.read, replay])",
				permissionList())
			return
		}
		held := make([]identity.Permission, len(perms))
		for i, s := range perms {
			held[i] = identity.Permission(s)
		}
		// A role that can give itself any role requires MFA as admin
		// does, unless it says otherwise (which NewRole refuses).
		mfa := identity.AdminEquivalent(held)
		decodeScalar(l, rm, rp, "require_mfa", &mfa, parseBool)
		if l.failed(rp.key("permissions")) || l.failed(rp.key("require_mfa")) {
			return
		}
		r, err := identity.NewRole(name, perms, mfa)
		if err != nil {
			field, why := rp, err.Error()
			if ie, ok := identity.IsInvalid(err); ok {
				why = ie.Reason
				if ie.Field != "role" {
					field = rp.key(ie.Field)
				}
			}
			l.errorf(field, "%s", why)
			l.bad[rp] = true
			return
		}
		if a.Roles == nil {
			a.Roles = make(map[string]identity.Role)
		}
		a.Roles[name] = r
	})
	l.entities(m["groups"], p.key("groups"), func(name string, n *yaml.Node, gp path) {
		gm := l.mapping(n, gp, "role", "channels")
		var g identity.GroupMapping
		decodeScalar(l, gm, gp, "role", &g.Role, asString)
		l.strings(gm, gp, "channels", &g.Channels)
		if a.Groups == nil {
			a.Groups = make(map[string]identity.GroupMapping)
		}
		a.Groups[name] = g
	})
	return a
}

// entities calls each for every name: definition of the mapping n. Unlike
// named, the names are not lane names: a role name is checked by
// identity.NewRole, and a group is named as the directory names it (an
// Entra object id, a Keycloak path such as /lab/analysts).
func (l *loader) entities(n *yaml.Node, p path, each func(name string, n *yaml.Node, p path)) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorAt(n, p, "must map names to definitions, not %s", describe(n))
		l.bad[p] = true
		return
	}
	seen := make(map[string]int)
	for _, e := range l.entries(n, p) {
		name := e.key.Value
		ep := member(p, name)
		if first, dup := seen[name]; dup {
			if !e.merged {
				l.errorAt(e.key, ep, "is defined twice (first on line %d); names must be unique", first)
			}
			continue
		}
		seen[name] = e.key.Line
		l.record(ep, e.key)
		each(name, resolve(e.value), ep)
	}
}

// member is the path of name in the map at p, quoted as the file may
// write it: access.groups["/lab/analysts"].role.
func member(p path, name string) path {
	p.rel += "[" + strconv.Quote(name) + "]"
	return p
}

func permissionList() string {
	names := make([]string, len(identity.Permissions))
	for i, p := range identity.Permissions {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// checkAccess checks that each group maps to a known role and readable
// channel patterns, and that SSO has groups to map people through.
func (l *loader) checkAccess(c *Config) {
	l.checkApprovals(c)
	p := path{section: "access"}.key("groups")
	names := make([]string, 0, len(c.Access.Groups))
	for n := range c.Access.Groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		g := c.Access.Groups[name]
		gp := member(p, name)
		rp := gp.key("role")
		switch {
		case l.failed(rp):
		case g.Role == "":
			l.errorf(rp, "is required: the role the group's members get (one of %s)", strings.Join(c.Access.RoleNames(), ", "))
		case !c.Access.hasRole(g.Role):
			if _, custom := l.pos[member(path{section: "access"}.key("roles"), g.Role)]; custom {
				break // the role's own error says why it is not defined
			}
			l.errorf(rp, "names the role %q, which is neither built in nor in access.roles%s (known: %s)",
				g.Role, didYouMean(g.Role, c.Access.RoleNames(), "%s"), strings.Join(c.Access.RoleNames(), ", "))
		}
		cp := gp.key("channels")
		for _, pat := range g.Channels {
			if _, err := filepath.Match(pat, ""); err != nil || pat == "" {
				l.errorf(cp, "%q is not a channel pattern (shell syntax: lab-*, adt-?)", pat)
			}
		}
	}
	if c.API != nil && c.API.SSO != nil && len(c.Access.Groups) == 0 && !l.failed(p) {
		l.errorf(path{section: "api"}.key("sso"), "lets people log in through the directory, but access.groups maps no group to a role, "+
			"so everyone would be refused; add e.g. access: {groups: {\"lab-analysts\": {role: viewer, channels: [\"lab-*\"]}}}")
	}
}
