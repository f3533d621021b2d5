package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/approval"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/console"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/identity"
)

// apiChannel labels the API's refused connections in
// mefor_connections_refused_total; no channel can be named so.
const apiChannel = "(api)"

// apiListener is the HTTPS API this node serves (the api: section), on
// every node, lease or not.
type apiListener struct {
	ln   net.Listener
	stop context.CancelFunc
	done chan error
}

// startAPI binds and serves the config's api: section, if any. Its
// connections pass admission's gate (allow, caps) before the TLS
// handshake, as an MLLP listener's do. The section is fixed at start
// (restartNeeded).
func (n *Node) startAPI(ctx context.Context, cfg *config.Config) error {
	a := cfg.API
	if a == nil {
		return nil
	}
	policy := admission.Policy{MaxConnections: a.MaxConnections, MaxConnectionsPerIP: a.MaxConnectionsPerIP}
	if len(a.Allow) > 0 {
		src, err := admission.NewSources(a.Allow)
		if err != nil {
			return fmt.Errorf("api.allow: %w", err)
		}
		policy.Allow = src
	}
	store := identity.New(n.opts.Pool, identity.Options{Keys: n.opts.Keys, SessionIdle: a.SessionIdle, SessionMax: a.SessionMax,
		Roles: cfg.Access.Roles, Groups: cfg.Access.Groups})
	var approvals api.Approvals
	if ap := cfg.Access.Approvals; ap != nil {
		approvals = api.Approvals{Store: approval.New(n.opts.Pool, approval.Options{Expire: ap.Expire}), RequiredFor: ap.RequiredFor}
	}
	var sso *api.OIDC
	if a.SSO != nil {
		o := a.SSO.OIDC
		// The provider is reached through the egress policy, as every
		// outbound connection is (config lists the issuer in Outbound).
		client := n.egress.Load().HTTPClient("sso:oidc", egress.HTTPOptions{})
		client.Timeout = 30 * time.Second
		sso = &api.OIDC{Issuer: o.Issuer, ClientID: o.ClientID, ClientSecret: o.ClientSecret, RedirectURL: o.RedirectURL,
			GroupsClaim: o.GroupsClaim, Scopes: o.Scopes, RequireAMR: o.RequireAMR, HTTPClient: client}
	}
	srv, err := api.New(api.Config{Listen: a.Listen, CertFile: a.TLS.CertFile, KeyFile: a.TLS.KeyFile, Plaintext: a.Plaintext,
		Admission: policy, Reads: n.opts.APIReads, Actions: n.opts.APIActions, Approvals: approvals, SSO: sso,
		AlertChannel: n.alertChannel,
		Console: func(h http.Handler) http.Handler {
			return console.New(h, console.Options{SSO: sso != nil, Logger: n.logger, Approvals: approvals.RequiredFor})
		}},
		store, n.logger,
		func(r admission.Reason) { n.metrics.ConnectionRefused(apiChannel, string(r)) })
	if err != nil {
		return err
	}
	ln, err := srv.Listen()
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &apiListener{ln: ln, stop: stop, done: make(chan error, 1)}
	go func() { l.done <- srv.Serve(sctx, ln) }()
	n.api = l
	n.logger.InfoContext(ctx, "serving the API", "listen", ln.Addr().String(), "tls", srv.TLS())
	return nil
}

// stopAPI stops serving the API, letting requests in flight finish.
func (n *Node) stopAPI(ctx context.Context) {
	if n.api == nil {
		return
	}
	n.api.stop()
	if err := <-n.api.done; err != nil {
		n.logger.WarnContext(ctx, "the API stopped with an error", "error", err)
	}
}

// APIAddr is the address the API listens on ("" without an api:
// section), for tests that listen on port 0.
func (n *Node) APIAddr() string {
	if n.api == nil {
		return ""
	}
	return n.api.ln.Addr().String()
}

// alertChannel names the channel an alert rule of the node's current
// config watches ("" for a destination's or an audit target's), for the
// API's scoping of the alert list.
func (n *Node) alertChannel(rule string) (string, bool) {
	a := n.Config().Alerts
	if a == nil {
		return "", false
	}
	for _, r := range a.Rules {
		if r.Name == rule {
			return r.Channel, true
		}
	}
	return "", false
}
