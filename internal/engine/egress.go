package engine

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/url"
	"strings"

	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/notify"
	"github.com/mefor/mefor/internal/reference"
)

// Where data may go.
//
// A node builds the egress policy of its config when it is built and at
// each reload, even of an unchanged file: the policy pins the addresses of
// the host names the config connects to as they resolve then
// (egress.NewPolicy), so a reload is how an operator accepts a host's new
// address. Every outbound connection (destinations, reference sources,
// alert webhooks, audit forwarding) dials through the policy in force (n.egress), read at
// each connection. A connection refused is counted in
// mefor_egress_refused_total and logged with its target and addresses.
// The file itself was checked against egress.allow when it was loaded, so
// a config naming a host outside the list never runs.

// buildEgress returns cfg's policy, nil when it has no egress: section,
// logging each name that did not resolve (it is pinned at its first
// connection).
func (n *Node) buildEgress(ctx context.Context, cfg *config.Config) *egress.Policy {
	if cfg.Egress == nil {
		return nil
	}
	p, errs := egress.NewPolicy(ctx, cfg.Egress.Allow, cfg.OutboundHosts(), egress.Options{
		Resolver: n.opts.EgressResolver,
		OnRefuse: n.egressRefused,
	})
	for _, err := range errs {
		n.logger.WarnContext(ctx, "egress: a host the config connects to did not resolve; its addresses are pinned at its first connection",
			"error", err)
	}
	return p
}

// egressRefused counts and logs a connection the policy refused. Nothing
// of what it would have carried is known here, let alone logged.
func (n *Node) egressRefused(r *egress.RefusedError) {
	n.metrics.EgressRefused(r.Target)
	pinned := make([]string, len(r.Pinned))
	for i, a := range r.Pinned {
		pinned[i] = a.String()
	}
	n.logger.Warn("egress: connection refused, nothing was sent", "target", r.Target, "host", r.Host, "addr", r.Addr,
		"pinned", strings.Join(pinned, ","), "error", r.Error())
}

// referenceEgress is how a sync reaches set's source.
func (n *Node) referenceEgress(set *config.ReferenceSet) reference.Egress {
	var tc *tls.Config
	if c := n.tls.set.ReferenceClient(set.Name); c != nil {
		tc = c.Config()
	}
	return reference.EgressOf(n.egress.Load(), tc, set)
}

// alertTransport is how an alert sink connects: through the policy in
// force, with the sink's TLS configuration.
func (n *Node) alertTransport(sink *config.AlertSink) notify.Transport {
	return notify.TransportOf(n.egress.Load(), n.tls.set, sink.Name)
}

// auditForwardSenders are the senders of f's targets, by target, dialling
// through the policy and TLS configurations in force.
func (n *Node) auditForwardSenders(f *config.AuditForward) map[string]auditforward.Sender {
	p := n.egress.Load()
	out := map[string]auditforward.Sender{}
	if s := f.Syslog; s != nil {
		tc := &tls.Config{MinVersion: s.TLS.MinVersion, ServerName: s.TLS.ServerName}
		if c := n.tls.set.AuditForwardClient(auditforward.TargetSyslog); c != nil && c.Config() != nil {
			tc = c.Config()
		}
		out[auditforward.TargetSyslog] = &auditforward.Syslog{Address: s.Address, TLS: tc,
			Dial: p.Dialer("audit_forward:" + auditforward.TargetSyslog), Hostname: n.opts.NodeID,
			AppName: s.AppName, Facility: s.Facility, Timeout: s.Timeout, NoConfirm: !s.Confirm}
	}
	if w := f.Webhook; w != nil {
		o := egress.HTTPOptions{}
		if c := n.tls.set.AuditForwardClient(auditforward.TargetWebhook); c != nil {
			o.TLS = c.Config()
		}
		if w.Proxy != "" {
			if u, err := url.Parse(w.Proxy); err == nil {
				o.Proxy = u
			}
		}
		h := http.Header{}
		for _, hd := range w.Headers {
			h.Add(hd.Name, hd.Value)
		}
		out[auditforward.TargetWebhook] = &auditforward.Webhook{URL: w.URL, Headers: h, Timeout: w.Timeout,
			Client: p.HTTPClient("audit_forward:"+auditforward.TargetWebhook, o)}
	}
	return out
}

// egressOf is what `mefor status` shows of cfg's egress: its list and the
// connections in plaintext.
func egressOf(cfg *config.Config) nodeinfo.NodeEgress {
	e := nodeinfo.NodeEgress{Restricted: cfg.Egress != nil, Allow: []string{}, Plaintext: []nodeinfo.PlaintextOutbound{}}
	if cfg.Egress != nil {
		e.Allow = cfg.Egress.Allow.Strings()
	}
	for _, o := range cfg.Outbound() {
		if o.Plaintext {
			e.Plaintext = append(e.Plaintext, nodeinfo.PlaintextOutbound{Target: o.Target, Address: o.Address(), Protocol: o.Protocol})
		}
	}
	return e
}
