package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/tick"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/workers"
)

// Config reload.
//
// A node runs the config its graph was built from. Reload re-reads the
// node's own file (the path it was started with), validates it, and swaps
// the graph atomically: drainers pick the new graph up at their next batch,
// so a row already in hand finishes under the config it started with and
// nothing in flight is dropped. Listeners whose settings changed, or whose
// certificate revocation list did, are drained (messages being received
// are stored and acknowledged) and bound again, so a narrower allow list
// or a revoked certificate also ends the connections already open;
// senders whose destination changed are replaced at the lane's next send
// (connector.Pool.Get).
//
// Cluster convergence: an operator reload (`mefor reload`, or Reload on one
// node after SIGHUP) bumps the cluster config version. Every node watches
// it, every heartbeat and on NOTIFY, and reloads its own copy of the file
// when the cluster version passes the one it applied. A node that starts
// records the current version as applied, since it has just read its file.
//
// What a reload refuses (the file is not applied, the node keeps running
// its config and says why, on its row and in its log):
//   - an invalid file (the same errors as `mefor config check`);
//   - a change of the cluster timings: the heartbeat, fence watchdog, lease
//     and node timeout are fixed when the node starts, and a node running
//     other timings than its peers would break the lease's safety margin;
//   - destination timeouts whose longest connect_timeout + ack_timeout
//     exceeds the one the node started with: drainer job time limits are
//     fixed at start, and a send outliving them would be cut off;
//   - a change of the maintenance jobs or their schedules (retention, a
//     reference set added or removed, a refresh schedule): River's periodic
//     jobs are fixed at start. What a job does (retention windows, a
//     reference set's source) is read from the running config, so it is
//     reloaded;
//   - a new listen address that cannot be bound (nothing is changed);
//   - a certificate, key or CA file that does not read, does not match or
//     has expired (tls.go); the files are re-read at every reload, so a
//     renewal needs no change to the config file.
//
// Every reload, of an unchanged file too, builds the egress policy again
// (egress.go): the host names the config connects to are resolved and
// pinned anew, which is how a host's new address is accepted.
//
// What a reload removes: rows still queued for a channel, route, handler or
// destination the new file no longer has are dead-lettered with the reason,
// exactly as a restart with that file does, so they show in `mefor dead
// list` and can be replayed if the removal was a mistake; but only once the
// cluster agrees on the file (every live node applied the reload, from the
// same file): until then another node may still serve them.

// ReloadResult says what a reload did on this node.
type ReloadResult struct {
	// Version is the cluster config version this node now runs.
	Version int64 `json:"version"`
	// Hash is the hash of the file this node now runs.
	Hash string `json:"hash"`
	// Changed is false when the file was identical to the running one.
	Changed bool `json:"changed"`
	// DeadLettered counts queued rows dead-lettered because what they were
	// queued for is no longer in the config.
	DeadLettered int `json:"dead_lettered"`
	// Listeners lists the channels whose listener was bound, rebound or
	// closed.
	Listeners []string `json:"listeners,omitempty"`
	// Renewed lists the certificate and key files whose content changed:
	// new connections use them, established ones carry on.
	Renewed []string `json:"renewed,omitempty"`
}

// RestartError is a reload refused because it changes settings that apply
// only when a node starts.
type RestartError struct {
	Reasons []string
}

func (e *RestartError) Error() string {
	return "not applied, these changes need a restart: " + strings.Join(e.Reasons, "; ") +
		" (restart the nodes one at a time with the new file, or revert these settings and reload)"
}

// reloadState is the node's reload machinery.
type reloadState struct {
	// mu serializes reloads: an operator reload and the watcher never
	// apply at the same time.
	mu sync.Mutex
	// applied is the cluster config version this node runs; recorded is
	// the one its row says, behind applied only after a failed write.
	applied, recorded atomic.Int64
	// lastErr is the last failure logged, so a file that stays bad is
	// logged once, not every heartbeat.
	lastErr string

	stop context.CancelFunc
	done chan struct{}
}

// Config returns the config the node runs now.
func (n *Node) Config() *config.Config { return n.graph.Load().Config() }

// AppliedConfigVersion is the cluster config version this node runs.
func (n *Node) AppliedConfigVersion() int64 { return n.reload.applied.Load() }

// Reload re-reads this node's config file and applies it, then bumps the
// cluster config version so every other node reloads its own copy. It is
// what SIGHUP does. A bad file changes nothing: the error says why and is
// recorded on the node's row.
func (n *Node) Reload(ctx context.Context) (*ReloadResult, error) {
	rs := &n.reload
	rs.mu.Lock()
	defer rs.mu.Unlock()
	res, err := n.applyFile(ctx)
	if err != nil {
		if rerr := leader.RecordConfigError(ctx, n.opts.Pool, n.opts.NodeID, rs.applied.Load(), err.Error()); rerr != nil {
			n.logger.WarnContext(ctx, "could not record the failed reload", "error", rerr)
		}
		return nil, err
	}
	var v int64
	err = pgx.BeginFunc(ctx, n.opts.Pool, func(tx pgx.Tx) error {
		var err error
		if v, err = leader.BumpClusterConfig(ctx, tx, res.Hash, "node "+n.opts.NodeID); err != nil {
			return err
		}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionReload, Node: n.opts.NodeID,
			Outcome: audit.OutcomeRequested, Target: map[string]any{"version": v, "config_hash": res.Hash, "by": "signal"}})
	})
	if err != nil {
		return nil, fmt.Errorf("applied on this node, but the other nodes were not told (reload again): %w", err)
	}
	rs.applied.Store(v)
	res.Version = v
	n.recordApplied(ctx, v, res.Hash)
	if res.Changed {
		res.DeadLettered = n.deadLetterOrphans(ctx)
	}
	n.logger.InfoContext(ctx, "config reloaded", "version", v, "config_hash", short(res.Hash),
		"changed", res.Changed, "dead_lettered", res.DeadLettered, "listeners", res.Listeners, "renewed", res.Renewed)
	return res, nil
}

// startConfigWatch records the cluster config version as applied (the node
// has just read its file, so it must not reload it again) and starts
// watching the version.
func (n *Node) startConfigWatch(ctx context.Context) error {
	cc, err := leader.ReadClusterConfig(ctx, n.opts.Pool)
	if err != nil {
		return err
	}
	n.reload.applied.Store(cc.Version)
	if err := leader.RecordConfigApplied(ctx, n.opts.Pool, n.opts.NodeID, cc.Version, n.Config().Hash()); err != nil {
		return err
	}
	n.reload.recorded.Store(cc.Version)

	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	n.reload.stop, n.reload.done = stop, make(chan struct{})
	kick := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); n.listenConfig(wctx, kick) }()
	go func() { defer wg.Done(); n.watchConfig(wctx, kick) }()
	go func() { wg.Wait(); close(n.reload.done) }()
	return nil
}

// stopConfigWatch stops the watcher and waits for a reload in progress.
func (n *Node) stopConfigWatch() {
	if n.reload.stop == nil {
		return
	}
	n.reload.stop()
	<-n.reload.done
}

// watchConfig checks the cluster config version every heartbeat and when
// kicked by a NOTIFY.
func (n *Node) watchConfig(ctx context.Context, kick <-chan struct{}) {
	tick.EveryOrKicked(ctx, n.opts.Config.Cluster.Heartbeat, kick, func(ctx context.Context) {
		if err := n.checkSealedStore(ctx, false); err != nil && ctx.Err() == nil {
			n.logger.WarnContext(ctx, "could not read whether the store is sealed", "error", err)
		}
		n.checkConfigVersion(ctx)
	})
}

// listenConfig turns NOTIFYs of a version bump into kicks, on a connection
// of its own: a LISTEN holds its connection for good, which would take one
// from the pool the drainers share.
func (n *Node) listenConfig(ctx context.Context, kick chan<- struct{}) {
	for ctx.Err() == nil {
		err := n.listenOnce(ctx, kick)
		if ctx.Err() != nil {
			return
		}
		n.logger.DebugContext(ctx, "config notifications interrupted; polling meanwhile", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.opts.Config.Cluster.Heartbeat):
		}
	}
}

func (n *Node) listenOnce(ctx context.Context, kick chan<- struct{}) error {
	conn, err := pgx.ConnectConfig(ctx, n.opts.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+leader.ConfigNotifyChannel); err != nil {
		return err
	}
	// A bump between the node's last check and the LISTEN would otherwise
	// wait for the next tick.
	select {
	case kick <- struct{}{}:
	default:
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

// checkConfigVersion reloads the node's file when the cluster version is
// newer than the applied one. A bad file keeps the running config; it is
// logged once and recorded on the node's row, and the file is read again at
// each check, so fixing it is enough to converge.
func (n *Node) checkConfigVersion(ctx context.Context) {
	rs := &n.reload
	cc, err := leader.ReadClusterConfig(ctx, n.opts.Pool)
	if err != nil {
		if ctx.Err() == nil {
			n.logger.WarnContext(ctx, "could not read the cluster config version", "error", err)
		}
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if cc.Version <= rs.applied.Load() {
		if v := rs.applied.Load(); rs.recorded.Load() != v {
			n.recordApplied(ctx, v, n.Config().Hash())
		}
		return
	}
	res, err := n.applyFile(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if msg := err.Error(); msg != rs.lastErr {
			rs.lastErr = msg
			n.logger.ErrorContext(ctx, "config reload failed; still running the previous config",
				"version", cc.Version, "error", err)
			if rerr := leader.RecordConfigError(ctx, n.opts.Pool, n.opts.NodeID, cc.Version, msg); rerr != nil {
				rs.lastErr = "" // record it at the next check
				n.logger.WarnContext(ctx, "could not record the failed reload", "error", rerr)
			}
		}
		return
	}
	rs.lastErr = ""
	rs.applied.Store(cc.Version)
	res.Version = cc.Version
	n.recordApplied(ctx, cc.Version, res.Hash)
	// The last node to apply a reload is the one that finds the cluster
	// agreed; each node checks, whether or not its file changed.
	res.DeadLettered = n.deadLetterOrphans(ctx)
	n.logger.InfoContext(ctx, "config reloaded to match the cluster", "version", cc.Version,
		"config_hash", short(res.Hash), "reference_hash", short(cc.Hash), "changed", res.Changed,
		"dead_lettered", res.DeadLettered, "listeners", res.Listeners, "renewed", res.Renewed)
	if cc.Hash != "" && res.Hash != cc.Hash {
		n.logger.WarnContext(ctx, "this node's config file differs from the one the reload validated",
			"config_hash", short(res.Hash), "reference_hash", short(cc.Hash), "bumped_by", cc.BumpedBy)
	}
}

func (n *Node) recordApplied(ctx context.Context, version int64, hash string) {
	if err := leader.RecordConfigApplied(ctx, n.opts.Pool, n.opts.NodeID, version, hash); err != nil {
		n.logger.WarnContext(ctx, "could not record the applied config version; retrying at the next check", "error", err)
		return
	}
	n.reload.recorded.Store(version)
}

// applyFile loads the node's own file and applies it. Callers hold
// reload.mu.
func (n *Node) applyFile(ctx context.Context) (*ReloadResult, error) {
	cur := n.Config()
	next, err := config.Load(cur.File)
	if err != nil {
		return nil, err
	}
	return n.apply(ctx, cur, next)
}

// apply swaps the running config from cur to next: checks, then graph,
// then listeners, then dead-letters what next can no longer serve.
func (n *Node) apply(ctx context.Context, cur, next *config.Config) (*ReloadResult, error) {
	res := &ReloadResult{Hash: next.Hash()}
	// Certificate files are re-read even when the config file is the
	// same: renewing a certificate changes only its files.
	certs, err := n.tls.set.Prepare(next, time.Now())
	if err != nil {
		return nil, fmt.Errorf("not applied: %w", err)
	}
	// A listener whose revocation list changed is bound again, like one
	// whose settings changed: a connection made with a certificate now
	// revoked must not outlive the reload.
	revoked := crlRenewed(next, certs.Renewed())
	policy := n.buildEgress(ctx, next)
	// The same file keeps its graph, and its listeners unless a CRL they
	// check changed.
	changed := next.Hash() != cur.Hash()
	if !changed && len(revoked) == 0 {
		res.Renewed = n.commitTLS(ctx, certs)
		n.egress.Store(policy)
		n.recordTransport(ctx)
		return res, nil
	}
	var g *Graph
	if changed {
		if reasons := n.restartNeeded(next); len(reasons) > 0 {
			return nil, &RestartError{Reasons: reasons}
		}
		if g, err = n.buildGraph(ctx, next); err != nil {
			return nil, fmt.Errorf("not applied: %w", err)
		}
	}

	n.mu.Lock()
	plan, err := n.planListeners(cur, next, revoked)
	if err != nil {
		n.mu.Unlock()
		return nil, err
	}
	// Before the graph and the listeners: a destination or listener the
	// new config adds must find its TLS configuration.
	res.Renewed = n.commitTLS(ctx, certs)
	n.egress.Store(policy)
	if changed {
		n.graph.Store(g)
		res.Changed = true
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.opts.StopTimeout)
	res.Listeners = n.swapListeners(sctx, plan)
	if changed {
		res.Listeners = append(res.Listeners, n.swapPollersLocked(sctx, next)...)
	}
	cancel()
	n.mu.Unlock()
	n.recordTransport(ctx)
	return res, nil
}

// buildGraph compiles cfg with its destinations' layout generations,
// numbering the layouts the cluster has not delivered under before
// (pipeline.ResolveLayouts): an ordering change gets lanes of its own, which
// deliver only once the lanes of the previous ordering have drained.
func (n *Node) buildGraph(ctx context.Context, cfg *config.Config) (*Graph, error) {
	layouts := make(map[string]string, len(cfg.Destinations))
	for _, d := range cfg.Destinations {
		layouts[d.Name] = d.Ordering.Layout()
	}
	gens, err := pipeline.ResolveLayouts(ctx, n.opts.Pool, layouts)
	if err != nil {
		return nil, err
	}
	return NewGraphWith(cfg, gens, n.graphOptions()...)
}

// deadLetterOrphans dead-letters the rows the node's config cannot serve,
// when that config is the cluster's agreed one, and returns how many. A
// node whose file differs from the others', or that is ahead of or behind
// them, leaves such rows alone: another node may still serve them. Call it
// after the node recorded the config it applied.
func (n *Node) deadLetterOrphans(ctx context.Context) int {
	if !n.configAgreed(ctx) {
		return 0
	}
	dead, err := pipeline.DeadLetterOrphans(ctx, n.opts.Pool, knownOf(n.Config()))
	if err != nil {
		// The drainers dead-letter such rows as they reach them anyway.
		n.logger.WarnContext(ctx, "could not dead-letter rows the config no longer serves", "error", err)
	}
	if dead > 0 {
		n.logger.WarnContext(ctx, "dead-lettered queued rows the cluster's config no longer serves", "rows", dead)
	}
	return dead
}

// configAgreed reports whether the cluster agrees on this node's config
// (leader.ReadConfigAgreement), logging when that changes, so a node whose
// file differs says so once rather than at every row it leaves alone.
func (n *Node) configAgreed(ctx context.Context) bool {
	a, err := leader.ReadConfigAgreement(ctx, n.opts.Pool, n.opts.NodeID)
	if err != nil {
		a.Reason = "cannot read the nodes' configs: " + err.Error()
	}
	n.agreeMu.Lock()
	defer n.agreeMu.Unlock()
	if a.Reason != n.disagreement {
		if a.Agreed {
			n.logger.InfoContext(ctx, "the cluster agrees on this node's config again: rows it cannot serve are dead-lettered")
		} else {
			n.logger.WarnContext(ctx, "this node's config is not the cluster's agreed one: rows for what its file lacks are left to the nodes that have it",
				"reason", a.Reason)
		}
		n.disagreement = a.Reason
	}
	return a.Agreed
}

// restartNeeded lists the changes next makes that a running node cannot
// apply, compared with the config the node started with (which fixed them).
func (n *Node) restartNeeded(next *config.Config) []string {
	start := n.opts.Config
	var why []string
	was, now := start.Cluster, next.Cluster
	if n.opts.ListenerPriority != nil {
		// --listener-priority decides, whatever the file says.
		was.ListenerPriority, now.ListenerPriority = 0, 0
	}
	if was != now {
		why = append(why, "the cluster section (heartbeat, fence_timeout, lease_ttl, node_timeout, listener_priority) is fixed at start")
	}
	if was, now := maxSendTimeout(start), maxSendTimeout(next); now > was {
		why = append(why, fmt.Sprintf(
			"the longest destination connect_timeout + ack_timeout grows from %s to %s, past the delivery time limit fixed at start", was, now))
	}
	if was, now := schedules(start), schedules(next); was != now {
		why = append(why, fmt.Sprintf("the maintenance jobs or their schedules change (%s → %s); River's periodic jobs are fixed at start", was, now))
	}
	if !reflect.DeepEqual(start.API, next.API) {
		why = append(why, "the api: section changes; the API's listener is fixed at start")
	}
	if !reflect.DeepEqual(start.Access, next.Access) {
		why = append(why, "the access: section changes; roles, group mappings and approvals are read at start")
	}
	// The keyring is read at start (run) and sealed into every writer.
	switch {
	case (start.Encryption == nil) != (next.Encryption == nil):
		why = append(why, "the encryption: section is added or removed; encryption keys are read at start")
	case next.Encryption != nil && !next.Encryption.Keys.SameKeys(n.opts.Keys):
		why = append(why, fmt.Sprintf("encryption.keys (${%s}) holds other keys than the node started with (%s); keys are read at start",
			next.Encryption.KeysVar, n.opts.Keys))
	}
	return why
}

// schedules lists cfg's maintenance jobs with their schedules.
func schedules(cfg *config.Config) string {
	var parts []string
	for _, j := range workers.MaintenanceJobs(cfg) {
		parts = append(parts, j.Name+" "+j.Schedule.String())
	}
	return strings.Join(parts, ", ")
}

// knownOf lists what cfg can serve, for DeadLetterOrphans.
func knownOf(cfg *config.Config) pipeline.Known {
	known := pipeline.Known{Handlers: []string{"passthrough"}}
	for _, ch := range cfg.Channels {
		known.Channels = append(known.Channels, ch.Name)
		for _, r := range ch.Routes {
			known.Routes = append(known.Routes, ch.Name+"/"+r.Name)
		}
	}
	for _, h := range cfg.Handlers {
		known.Handlers = append(known.Handlers, h.Name)
	}
	for _, d := range cfg.Destinations {
		known.Destinations = append(known.Destinations, d.Name)
	}
	return known
}

// crlRenewed lists the channels of cfg whose crl_file is among the
// renewed files.
func crlRenewed(cfg *config.Config, renewed []string) map[string]bool {
	out := map[string]bool{}
	for _, ch := range cfg.Channels {
		if in := ch.Inbound.MLLP; in != nil && in.TLS.CRLFile != "" && slices.Contains(renewed, in.TLS.CRLFile) {
			out[ch.Name] = true
		}
	}
	return out
}

// listenerPlan is how a reload changes the bound listeners.
type listenerPlan struct {
	keep  []*boundListener
	close []*boundListener
	open  []pendingListener
}

// pendingListener is a channel to bind; ln is already listening, or nil
// when its address is held by a listener the plan closes first.
type pendingListener struct {
	ch *config.Channel
	ln net.Listener
}

// planListeners decides which bound listeners next changes, and binds new
// addresses before anything is changed, so an address that cannot be bound
// refuses the reload instead of leaving a channel deaf. The channels in
// rebind are bound again even when unchanged. A node that has no
// listeners bound (it does not hold the listener lease) plans nothing: it
// binds from the current config when it takes the lease. Callers hold n.mu.
func (n *Node) planListeners(cur, next *config.Config, rebind map[string]bool) (*listenerPlan, error) {
	plan := &listenerPlan{}
	if !n.bound {
		return plan, nil
	}
	bound := map[string]bool{}
	freed := map[string]bool{} // addresses of listeners the plan closes
	for _, bl := range n.listeners {
		bound[bl.channel] = true
		was, now := cur.Channel(bl.channel), next.Channel(bl.channel)
		same := was != nil && was.Inbound.MLLP != nil && now != nil && now.Inbound.MLLP != nil &&
			sameListener(was.Inbound.MLLP, now.Inbound.MLLP) && !rebind[bl.channel]
		switch {
		case now == nil || now.Inbound.MLLP == nil:
			plan.close = append(plan.close, bl)
		case same:
			plan.keep = append(plan.keep, bl)
		default:
			plan.close = append(plan.close, bl)
			plan.open = append(plan.open, pendingListener{ch: now})
		}
		if was != nil && was.Inbound.MLLP != nil && !same {
			freed[was.Inbound.MLLP.Listen] = true
		}
	}
	for i := range next.Channels {
		ch := &next.Channels[i]
		if ch.Inbound.MLLP != nil && !bound[ch.Name] {
			plan.open = append(plan.open, pendingListener{ch: ch})
		}
	}
	for i := range plan.open {
		p := &plan.open[i]
		if freed[p.ch.Inbound.MLLP.Listen] {
			continue // bound once the old listener has let go of it
		}
		ln, err := net.Listen("tcp", p.ch.Inbound.MLLP.Listen)
		if err != nil {
			for _, q := range plan.open[:i] {
				if q.ln != nil {
					q.ln.Close()
				}
			}
			return nil, fmt.Errorf("not applied: channel %q: listen on %s: %w", p.ch.Name, p.ch.Inbound.MLLP.Listen, err)
		}
		p.ln = ln
	}
	return plan, nil
}

// swapListeners closes the listeners the plan replaces (each drains: a
// message being received is stored and acknowledged) and serves the new
// ones. It returns the channels whose listener changed. Callers hold n.mu.
func (n *Node) swapListeners(ctx context.Context, plan *listenerPlan) []string {
	var changed []string
	for _, bl := range plan.close {
		n.closeListener(ctx, bl)
		changed = append(changed, bl.channel)
	}
	listeners := plan.keep
	for _, p := range plan.open {
		ln := p.ln
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", p.ch.Inbound.MLLP.Listen); err != nil {
				// The old listener had this address a moment ago; say loudly
				// that the channel is deaf rather than fail a half-done swap.
				n.logger.ErrorContext(ctx, "channel is not listening after the reload; reload again or restart",
					"channel", p.ch.Name, "addr", p.ch.Inbound.MLLP.Listen, "error", err)
				continue
			}
		}
		listeners = append(listeners, n.serveListener(ctx, p.ch, ln))
		if !slices.Contains(changed, p.ch.Name) {
			changed = append(changed, p.ch.Name)
		}
	}
	n.listeners = listeners
	n.publishGatesLocked()
	return changed
}

func (n *Node) closeListener(ctx context.Context, bl *boundListener) {
	if err := bl.server.Shutdown(ctx); err != nil {
		n.logger.WarnContext(ctx, "listener did not drain in time", "channel", bl.channel, "error", err)
	}
	<-bl.done
	n.logger.InfoContext(ctx, "stopped listening", "channel", bl.channel)
}

// serveListener serves ch's messages on ln, behind ch's admission gate.
func (n *Node) serveListener(ctx context.Context, ch *config.Channel, ln net.Listener) *boundListener {
	gate := n.newGate(ch)
	bl := &boundListener{channel: ch.Name, server: n.newServer(ch, gate), gate: gate, ln: ln, done: make(chan error, 1)}
	go func() { bl.done <- bl.server.Serve(gate.Listener(ln)) }()
	n.logger.InfoContext(ctx, "listening", "channel", ch.Name, "addr", ln.Addr().String())
	return bl
}

// newGate builds ch's admission gate from its listener's allow list and
// caps, counting refusals in mefor_connections_refused_total.
func (n *Node) newGate(ch *config.Channel) *admission.Gate {
	in := ch.Inbound.MLLP
	p := admission.Policy{MaxConnections: in.MaxConnections, MaxConnectionsPerIP: in.MaxConnectionsPerIP}
	if len(in.Allow) > 0 {
		sources, err := admission.NewSources(in.Allow)
		if err != nil {
			// config.Load checked every entry, so this is a bug; an empty
			// list refuses everyone rather than let anyone in.
			n.logger.Error("allow list does not parse; refusing every connection", "channel", ch.Name, "error", err)
			sources = &admission.Sources{}
		}
		p.Allow = sources
	}
	return admission.NewGate(p, admission.Options{
		Refused: func(r admission.Reason) { n.metrics.ConnectionRefused(ch.Name, string(r)) },
		Logger:  n.logger.With("channel", ch.Name),
	})
}

// newServer builds ch's MLLP server; gate counts and logs the TLS
// handshakes it refuses.
func (n *Node) newServer(ch *config.Channel, gate *admission.Gate) *mllp.Server {
	in := ch.Inbound.MLLP
	return &mllp.Server{
		Handler:      n.intake.MLLPHandler(ch),
		MaxFrameSize: int(in.MaxFrameSize),
		ReadTimeout:  in.ReadTimeout,
		IdleTimeout:  in.IdleTimeout,
		OnOversize:   n.intake.OversizeACK(ch.Name, int(in.MaxFrameSize)),

		MaxRejectsInARow:   in.MaxUnparseableInARow,
		OnRejectsInARow:    n.intake.UnparseableInARow(ch.Name, in.MaxUnparseableInARow),
		MaxFramesPerSecond: in.MaxMessagesPerSecond,
		Paced:              func(d time.Duration) { n.metrics.Paced(ch.Name, d) },

		AckWritten: func(d time.Duration) { n.metrics.AckWritten(ch.Name, d) },
		TLSConfig:  n.serverTLS(ch.Name),
		HandshakeRefused: func(remote net.Addr, err *mllp.HandshakeError) {
			var r *admission.Refusal
			if errors.As(err, &r) {
				gate.Refused(remote, r.Reason, "certificate", r.Subject, "detail", r.Detail)
				return
			}
			gate.Refused(remote, admission.TLSHandshake, "detail", err.Reason, "error", err.Err.Error())
		},
		Logger: n.logger.With("channel", ch.Name),
	}
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
