package config

import (
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/identity"
)

// Approvals is dual control: an action whose permission RequiredFor names
// is not run when asked for through the API; it waits, as a request, for
// another person who holds the same permission to approve it
// (docs/access.md).
type Approvals struct {
	// RequiredFor lists permission names (replay-dead, cancel, stepdown,
	// keys.rotate, ...), each one of identity.Approvable. Defaults to none.
	RequiredFor []identity.Permission
	// Expire is how long a request waits for a decision before it can no
	// longer be approved. Defaults to 24h.
	Expire time.Duration
}

const defaultApprovalExpire = 24 * time.Hour

func (l *loader) decodeApprovals(n *yaml.Node, p path) *Approvals {
	a := &Approvals{Expire: defaultApprovalExpire}
	m := l.mapping(n, p, "required_for", "expire")
	var names []string
	l.strings(m, p, "required_for", &names)
	for _, name := range names {
		a.RequiredFor = append(a.RequiredFor, identity.Permission(name))
	}
	decodeScalar(l, m, p, "expire", &a.Expire, parseDuration)
	return a
}

// checkApprovals checks access.approvals: known permissions that name an
// action, and an expiry.
func (l *loader) checkApprovals(c *Config) {
	a := c.Access.Approvals
	if a == nil {
		return
	}
	p := path{section: "access"}.key("approvals")
	rp := p.key("required_for")
	for i, perm := range a.RequiredFor {
		if identity.IsApprovable(perm) {
			continue
		}
		var known []string
		for _, q := range identity.Approvable {
			known = append(known, string(q))
		}
		what := "is not a permission"
		if slices.Contains(identity.Permissions, perm) {
			what = "is a permission to read, which needs no second person"
		}
		l.errorf(rp.index(i), "%q %s; list permissions of actions: %s", perm, what, strings.Join(known, ", "))
	}
	if k := p.key("expire"); !l.failed(k) && a.Expire <= 0 {
		l.errorf(k, "must be > 0: how long a request waits for a second person (e.g. expire: 24h, the default)")
	}
}
