package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/cpupressure"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/workers"
)

// Options configure a node.
type Options struct {
	Config *config.Config
	// Pool's settings (not its connections) are what the node connects
	// with: it opens pools of its own from them, with the session settings
	// every node needs (dbpool.NodeConfig).
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// NodeID names this node in River and in logs.
	NodeID string
	// Limits bound each drainer execution. Defaults to workers.DefaultLimits.
	Limits workers.Limits
	// ReclaimInterval, when not zero, overrides the config's
	// maintenance.reclaim.schedule: how often River's leader sweeps for
	// stranded lanes.
	ReclaimInterval time.Duration
	// ListenerPriority, when set, overrides the config's
	// cluster.listener_priority (`mefor run --listener-priority`).
	ListenerPriority *int
	// StopTimeout bounds a graceful stop; past it running drainers are
	// cancelled. Defaults to 30s.
	StopTimeout time.Duration
	// OpenConnsAtStart makes Start open the node's pool's connections
	// (MaxConns of them) once, one at a time, before the drainers start and
	// the listeners bind (up to openConnsTimeout). A session's first
	// statements cost the server several times their usual time (it loads the
	// tables' and indexes' descriptions, and compiles the triggers'
	// functions); opened on demand, new sessions come in bursts when many
	// drainers end a slice together, and those first statements stall intake
	// meanwhile. After the start, sessions that closed are reopened on demand,
	// not all at once (as after a partition). `mefor run` sets it unless the
	// database URL sets pool_min_conns. Every new session of the node's pool
	// is readied (pipeline.WarmSession) either way.
	OpenConnsAtStart bool
	// MaxWorkers per stage queue. Default to 50 for ingress and routed, and
	// 500 for outbound.
	IngressWorkers, RoutedWorkers, OutboundWorkers int
	// MetricsCacheTTL is how long one database read serves the cluster
	// gauges of /metrics. Defaults to 5s.
	MetricsCacheTTL time.Duration
	// Keys seals message content at rest and opens it; nil (the default)
	// stores it in clear.
	Keys *crypt.Keyring
	// AuditKeys sign the audit anchors the node takes when it is River's
	// leader (MEFOR_AUDIT_KEY); nil (the default) takes them unsigned.
	AuditKeys *audit.Keys
	// APIReads serves the API's read endpoints (ops.APIReads over Pool,
	// which this package cannot import: ops imports it). Defaults to none:
	// the API then serves login, sessions and users only.
	APIReads api.Reads
	// APIActions serves the API's action endpoints (ops.APIActions, for
	// the same reason). Defaults to none: the API then serves no action.
	APIActions api.Actions
	// AlertRetryBase is the wait before an alert notification's first
	// retry (it doubles each time, up to 5m). Defaults to 1s.
	AlertRetryBase time.Duration
	// Contended, when set, replaces the node's reading of the host's CPU
	// pressure (cpupressure.Gauge): it decides whether woken drainers
	// gather (workers.Limits.Gather). Tests set it to fix the answer.
	Contended func() bool
	// HandoffsAlone commits every route and transform hand-off in a
	// transaction of its own instead of letting those arriving together
	// share one (workers.Handoffs); tests set it to compare.
	HandoffsAlone bool
	// ReadsAlone reads every lane with a round trip of its own instead of
	// letting drainers' reads made together share one (workers.Reads);
	// tests set it to compare.
	ReadsAlone bool
	// HandoffPatience is how long a hand-off waits for the one in flight
	// before it commits alone. Defaults to workers.DefaultHandoffPatience.
	HandoffPatience time.Duration
	// StageQueuePoll replaces how often River's producers of the stage
	// queues look for available drainers unannounced; tests set it long to
	// show that snoozed drainers are announced. Defaults to stageQueuePoll.
	StageQueuePoll time.Duration
	// NoSnoozeWake turns the snooze waker off (snoozewake.go), for tests.
	NoSnoozeWake bool
	// EgressResolver resolves the host names the egress policy pins
	// (egress.go). Defaults to the system's resolver, which connections
	// use too; tests give another to pin addresses a connection then does
	// not reach, as a DNS answer that changed would.
	EgressResolver egress.Resolver
}

// Node is one running mefor node.
type Node struct {
	opts     Options
	logger   *slog.Logger
	graph    atomic.Pointer[Graph]
	client   *river.Client[pgx.Tx]
	senders  *connector.Pool
	intake   *Intake
	stopping chan struct{}
	stopOnce sync.Once
	stopErr  error

	membership *leader.Membership
	stopBeat   context.CancelFunc
	beatDone   chan struct{}

	// pressure tells the drainers whether the host's CPUs are contended;
	// nil when Options.Contended answers instead. contended is whichever
	// answers.
	pressure  *cpupressure.Gauge
	contended func() bool
	// handoffs lets the drainers' hand-offs share transactions; nil with
	// Options.HandoffsAlone.
	handoffs *workers.Handoffs
	// reads lets the drainers' lane reads share round trips; nil with
	// Options.ReadsAlone.
	reads *workers.Reads

	// The listener lease decides whether this node binds the inbound
	// listeners; the other loops keep it, the listeners and the answers to
	// operator requests in step with it.
	lease        *leader.Lease
	control      *leader.Control
	clusterPool  *pgxpool.Pool // lease renewals, heartbeats, operator requests
	leaseChanged chan struct{}
	stopLease    context.CancelFunc // the lease loop and the control loop
	leaseDone    sync.WaitGroup
	stopSync     context.CancelFunc // the listener reconcile loop
	syncDone     chan struct{}
	stopWake     func() // the snooze waker (snoozewake.go) and its subscription
	wakeDone     chan struct{}
	// terminateWarned: the missing privilege to end dead nodes' sessions
	// was logged (once; only syncLoop touches it).
	terminateWarned bool

	mu        sync.Mutex
	listeners []*boundListener
	// gates are the bound listeners' admission gates by channel, for the
	// open connections gauge, which must not wait for n.mu (held while
	// listeners drain).
	gates   atomic.Pointer[map[string]*admission.Gate]
	pollers []*filePoller // file channels' pollers (filesource.go)
	// bound is set while the listeners are bound and the directories
	// polled, which is while the node holds the listener lease.
	bound bool

	reload reloadState  // config reload and the cluster config version watcher (reload.go)
	refs   *references  // reference-set cache, its watcher and the sync worker (reference.go)
	tls    transport    // certificates in use and their expiry watch (tls.go)
	egress egress.Gate  // the egress policy in force (egress.go)
	state  *state.Cache // transform state as this node last saw it (script.go)
	// agreeMu guards disagreement: why the cluster does not agree on this
	// node's config ("" when it does), as last logged.
	agreeMu      sync.Mutex
	disagreement string

	metrics *metrics.Metrics // the node's Prometheus registry (metrics.go)
	api     *apiListener     // the HTTPS API, when the config has api: (api.go)
}

type boundListener struct {
	channel string
	server  *mllp.Server
	// gate admits the listener's connections (allow, the caps) and counts
	// and logs every refusal, the TLS handshake's included.
	gate *admission.Gate
	ln   net.Listener
	done chan error
}

// New builds a node: the graph from the config and the River client with the
// stage workers and the reclaim periodic job. Nothing runs until Start.
func New(opts Options) (*Node, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Limits == (workers.Limits{}) {
		opts.Limits = workers.DefaultLimits
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 30 * time.Second
	}
	if opts.Config == nil || opts.Pool == nil || opts.NodeID == "" {
		return nil, errors.New("engine: a node needs a config, a database pool and a node id")
	}
	callerAfterConnect := opts.Pool.Config().AfterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), dbpool.NodeConfig(opts.Pool.Config(), dbpool.NodeOptions{
		ApplicationName: leader.ApplicationName(opts.NodeID), LeaseTTL: opts.Config.Cluster.LeaseTTL,
		Warm: pipeline.WarmSession, Logger: opts.Logger,
	}))
	if err != nil {
		return nil, fmt.Errorf("create connection pool: %w", err)
	}
	opts.Pool = pool
	n := &Node{opts: opts, logger: opts.Logger, senders: connector.NewPool(), stopping: make(chan struct{})}
	if err := n.loadTLS(opts.Config); err != nil {
		pool.Close()
		return nil, err
	}
	n.egress.Store(n.buildEgress(context.Background(), opts.Config))
	n.senders.UseEgress(&n.egress)
	n.refs = newReferences(opts)
	n.refs.syncer.Egress = n.referenceEgress
	n.state = state.NewCache(0)
	g, err := NewGraph(opts.Config, n.graphOptions()...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	n.graph.Store(g)

	wake := workers.NewWake()
	n.contended = opts.Contended
	if n.contended == nil {
		n.pressure = cpupressure.NewGauge(cpupressure.DefaultPath)
		n.contended = n.pressure.Busy
	}
	n.metrics = newMetrics(n)
	deps := &workers.Deps{
		Metrics:      n.metrics,
		Keys:         opts.Keys,
		Wake:         wake,
		Pool:         opts.Pool,
		Graph:        func() workers.Graph { return n.graph.Load() },
		Senders:      n.senders,
		Limits:       opts.Limits,
		Logger:       opts.Logger,
		Stopping:     n.stopping,
		State:        n.state,
		ConfigAgreed: n.configAgreed,
		Contended:    n.contended,
		// Stop sending a heartbeat before the others may count this node as
		// dead.
		Alive: func() bool {
			cl := opts.Config.Cluster
			return n.membership.Fresh(cl.NodeTimeout - cl.Heartbeat)
		},
	}
	if !opts.HandoffsAlone {
		deps.Handoffs = workers.NewHandoffs(opts.HandoffPatience)
		n.handoffs = deps.Handoffs
	}
	if !opts.ReadsAlone {
		deps.Reads = workers.NewReads()
		n.reads = deps.Reads
	}
	cl := opts.Config.Cluster
	if opts.ListenerPriority != nil {
		cl.ListenerPriority = *opts.ListenerPriority
	}
	// The lease and the heartbeat get connections of their own: on a node
	// whose pool is saturated by drainers, a renewal waiting for a
	// connection would fence a healthy holder and fail the listeners over.
	ccfg := opts.Pool.Config().Copy()
	ccfg.MaxConns, ccfg.MinConns = 2, 0
	// Nor are these sessions readied (pipeline.WarmSession): they run a few
	// small statements, and once a partition heals, a renewal that must
	// open a session within a heartbeat would miss its deadline while
	// the warm-up ran, again at every heartbeat, on a host short of CPU.
	ccfg.AfterConnect = callerAfterConnect
	// A stepdown's audit row and answer are written here.
	dbpool.DurableCommits(&ccfg.ConnConfig.Config)
	cpool, err := pgxpool.NewWithConfig(context.Background(), ccfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("create cluster connection pool: %w", err)
	}
	n.clusterPool = cpool
	n.leaseChanged = make(chan struct{}, 1)
	n.membership, err = leader.NewMembership(leader.MembershipConfig{
		Pool: cpool, NodeID: opts.NodeID, Heartbeat: cl.Heartbeat, NodeTimeout: cl.NodeTimeout, Logger: opts.Logger,
		HoldsLease:       func() bool { return n.lease.Serving() },
		ListenerPriority: cl.ListenerPriority, NeverListens: cl.ListenerPriority == 0,
	})
	if err != nil {
		n.closePools()
		return nil, err
	}
	n.lease, err = leader.NewLease(leader.LeaseConfig{
		Pool: cpool, NodeID: opts.NodeID, Heartbeat: cl.Heartbeat, FenceTimeout: cl.FenceTimeout, TTL: cl.LeaseTTL,
		Priority: cl.ListenerPriority, Never: cl.ListenerPriority == 0, Logger: opts.Logger,
		Changed: func() {
			select {
			case n.leaseChanged <- struct{}{}:
			default:
			}
		},
		Drain: n.UnbindListeners,
		// The renewal carries the heartbeat: one write a heartbeat, not two.
		Membership: n.membership,
	})
	if err != nil {
		n.closePools()
		return nil, err
	}
	n.control = &leader.Control{Pool: cpool, NodeID: opts.NodeID, Lease: n.lease, Heartbeat: cl.Heartbeat, Logger: opts.Logger}
	sendTimeout := maxSendTimeout(opts.Config)
	w := river.NewWorkers()
	river.AddWorker(w, &workers.IngressWorker{Deps: deps})
	river.AddWorker(w, &workers.RoutedWorker{Deps: deps})
	river.AddWorker(w, &workers.OutboundWorker{Deps: deps, SendTimeout: sendTimeout})
	river.AddWorker(w, &workers.ReclaimWorker{Deps: deps})
	refWorker := n.refs.worker(n.Config)
	refWorker.Metrics = n.metrics
	river.AddWorker(w, refWorker)
	river.AddWorker(w, &workers.RetentionWorker{Deps: deps, NodeID: opts.NodeID,
		Policy: func() *config.Retention { return n.Config().Maintenance.Retention }})
	river.AddWorker(w, &workers.AuditAnchorWorker{Deps: deps, NodeID: opts.NodeID, Keys: opts.AuditKeys})
	river.AddWorker(w, &workers.AuditForwardWorker{Deps: deps, Config: n.Config, Senders: n.auditForwardSenders})
	river.AddWorker(w, &workers.AlertEvalWorker{Deps: deps, Config: n.Config})
	river.AddWorker(w, &workers.AlertNotifyWorker{Pool: opts.Pool, Config: n.Config, Logger: opts.Logger,
		RetryBase: opts.AlertRetryBase, Transport: n.alertTransport, Hostname: opts.NodeID})
	maintenance := workers.MaintenanceJobs(opts.Config)
	if opts.ReclaimInterval > 0 {
		maintenance[0].Schedule = config.Every(opts.ReclaimInterval) // reclaim is always first
	}

	// A drainer legitimately runs for its longest execution plus one slow
	// send; River must not rescue it before that, but should soon after
	// (the default is an hour, far too long for a blocked lane).
	jobTimeout := opts.Limits.Longest() + sendTimeout + 30*time.Second
	client, err := river.NewClient(riverpgxv5.New(opts.Pool), &river.Config{
		ID:     opts.NodeID,
		Logger: riverLogger(opts.Logger),
		Queues: map[string]river.QueueConfig{
			jobs.QueueIngress:  {MaxWorkers: or(opts.IngressWorkers, 50)},
			jobs.QueueRouted:   {MaxWorkers: or(opts.RoutedWorkers, 50)},
			jobs.QueueOutbound: {MaxWorkers: or(opts.OutboundWorkers, 500)},
			// A slot per job: retention never holds up reclaim.
			jobs.QueueMaintenance: {MaxWorkers: len(maintenance) + 1, FetchPollInterval: slowQueuePoll},
			jobs.QueueAlerts:      {MaxWorkers: 5, FetchPollInterval: slowQueuePoll},
		},
		Workers:              w,
		JobTimeout:           jobTimeout,
		RescueStuckJobsAfter: jobTimeout + 10*time.Second,
		// A newly activated lane should start within milliseconds: its
		// insert NOTIFYs the producers, which fetch at once.
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: cmp.Or(opts.StageQueuePoll, stageQueuePoll),
		PeriodicJobs:      workers.PeriodicJobs(maintenance),
	})
	if err != nil {
		n.closePools()
		return nil, fmt.Errorf("create River client: %w", err)
	}
	n.client = client
	// Intake announces the drainers it activates after its commit, so its
	// inserts must not notify inside the transaction a sender waits on.
	quiet, err := jobs.NewQuietInserter(opts.Pool, riverLogger(opts.Logger))
	if err != nil {
		n.closePools()
		return nil, err
	}
	n.intake = &Intake{Pool: opts.Pool, Inserter: quiet, Logger: opts.Logger, Wake: wake, Gate: n.lease, Metrics: n.metrics,
		Keys: opts.Keys, Linger: opts.Limits.Linger}
	return n, nil
}

// stageQueuePoll and slowQueuePoll are how often River's producers of the
// stage queues, and of the maintenance and alert queues, look for jobs
// without being notified: River's default of 1s, a backstop behind the
// snooze waker, and 5s. The package doc ("Polling") says why.
const (
	stageQueuePoll = time.Second
	slowQueuePoll  = 5 * time.Second
)

func or(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func maxSendTimeout(cfg *config.Config) time.Duration {
	longest := 5 * time.Second
	for _, d := range cfg.Destinations {
		if d.MLLP != nil && d.MLLP.ConnectTimeout+d.MLLP.AckTimeout > longest {
			longest = d.MLLP.ConnectTimeout + d.MLLP.AckTimeout
		}
		if d.HTTP != nil && d.HTTP.Timeout > longest {
			longest = d.HTTP.Timeout
		}
	}
	return longest
}

// Pool is the pool the node's own sessions come from (see dbpool.NodeConfig).
func (n *Node) Pool() *pgxpool.Pool { return n.opts.Pool }

// Client is the node's River client (for inserting jobs, e.g. in tests).
func (n *Node) Client() *river.Client[pgx.Tx] { return n.client }

// Intake is the node's intake, for other sources than its listeners.
func (n *Node) Intake() *Intake { return n.intake }

// Start joins the cluster, dead-letters rows the cluster's agreed config can
// no longer serve, starts the River client and binds the inbound listeners.
func (n *Node) Start(ctx context.Context) error {
	// Before anything produces rows: lanes are named by layout generation.
	g, err := n.buildGraph(ctx, n.Config())
	if err != nil {
		return err
	}
	n.graph.Store(g)
	if err := n.checkSealedStore(ctx, true); err != nil {
		return err
	}
	if err := n.membership.Join(ctx); err != nil {
		return err
	}
	n.warnIfNotDurable(ctx)
	n.startCertWatch(ctx)
	n.checkPressure(ctx)
	beatCtx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	n.stopBeat, n.beatDone = stopBeat, make(chan struct{})
	go func() {
		defer close(n.beatDone)
		n.membership.Run(beatCtx)
	}()
	if err := n.startConfigWatch(ctx); err != nil {
		return err
	}
	// After this node recorded what it runs, so the agreement check sees it.
	n.deadLetterOrphans(ctx)

	if err := n.refs.start(ctx, n.Config(), n.client); err != nil {
		return err
	}
	// Every node serves the API, lease or not; a bad address or
	// certificate stops the start here, before any drainer runs.
	if err := n.startAPI(ctx, n.Config()); err != nil {
		return err
	}
	if !n.opts.NoSnoozeWake {
		// Subscribed before the client starts, so no snooze goes unseen.
		events, unsubscribe := n.client.Subscribe(river.EventKindJobSnoozed)
		wakeCtx, stopWake := context.WithCancel(context.WithoutCancel(ctx))
		n.wakeDone = make(chan struct{})
		n.stopWake = func() { stopWake(); unsubscribe() }
		waker := newSnoozeWaker(n.opts.Pool, n.logger)
		go func() { defer close(n.wakeDone); waker.run(wakeCtx, events) }()
	}
	if n.opts.OpenConnsAtStart {
		// Before the drainers start and the listeners bind: opened while
		// traffic arrives, each new session's warm-up competed with the
		// first messages for the server's cores, and every message whose
		// statement waited for a new session waited for its warm-up too.
		n.openConns(ctx)
	}
	if err := n.client.Start(ctx); err != nil {
		return fmt.Errorf("start River client: %w", err)
	}

	// One claim attempt before returning, so a lone node (or the first of a
	// cluster) is listening when Start returns and a bad listen address is
	// reported here rather than in a log line.
	n.lease.Tick(ctx)
	if err := n.syncListeners(ctx); err != nil {
		n.lease.Release(ctx)
		return err
	}
	leaseCtx, stopLease := context.WithCancel(context.WithoutCancel(ctx))
	n.stopLease = stopLease
	n.leaseDone.Add(2)
	go func() { defer n.leaseDone.Done(); n.lease.Run(leaseCtx) }()
	go func() { defer n.leaseDone.Done(); n.control.Run(leaseCtx) }()
	syncCtx, stopSync := context.WithCancel(context.WithoutCancel(ctx))
	n.stopSync, n.syncDone = stopSync, make(chan struct{})
	go func() { defer close(n.syncDone); n.syncLoop(syncCtx) }()
	return nil
}

// Lease is the node's listener lease.
func (n *Node) Lease() *leader.Lease { return n.lease }

// syncLoop binds the listeners when the node holds the lease and unbinds
// them when it does not: at once on a lease edge, and every heartbeat to
// retry a bind that failed (a port still held by a stopping process).
func (n *Node) syncLoop(ctx context.Context) {
	t := time.NewTicker(n.opts.Config.Cluster.Heartbeat)
	defer t.Stop()
	for {
		edge := false
		select {
		case <-ctx.Done():
			return
		case <-n.leaseChanged:
			edge = true
		case <-t.C:
		}
		if err := n.syncListeners(ctx); err != nil {
			n.logger.ErrorContext(ctx, "holding the listener lease but cannot listen; retrying each heartbeat", "error", err)
		}
		if edge {
			// Show the new lease state in the node listing now rather
			// than at the next beat.
			_ = n.membership.Beat(ctx)
		} else {
			n.reclaimDeadNodes(ctx)
		}
	}
}

// reclaimDeadNodes enqueues a reclaim as soon as a dead node still holds
// running drainers, so its lanes move within node_timeout and a heartbeat
// even when the dead node was River's leader (which the periodic reclaim
// would wait out). The reclaim job is unique per second, so several nodes
// noticing at once enqueue one.
//
// Both looks share one transaction, as every node makes them every
// heartbeat; the sessions are ended under a savepoint so that a node
// without the privilege still looks for the drainers.
func (n *Node) reclaimDeadNodes(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, n.opts.Config.Cluster.Heartbeat)
	defer cancel()
	var ended []string
	var endErr error
	found := false
	err := pgx.BeginFunc(ctx, n.clusterPool, func(tx pgx.Tx) error {
		endErr = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			var err error
			ended, err = leader.TerminateDeadNodeSessions(ctx, sp)
			return err
		})
		var err error
		found, err = workers.HasDeadNodeDrainers(ctx, tx)
		return err
	})
	if endErr != nil {
		if !n.terminateWarned {
			n.terminateWarned = true
			n.logger.WarnContext(ctx, "cannot end the database sessions of dead nodes; their locks stay until TCP gives up "+
				"(grant the nodes' role pg_signal_backend, or run every node as one role)", "error", endErr)
		}
	} else if len(ended) > 0 {
		n.logger.WarnContext(ctx, "ended the database sessions of dead nodes", "nodes", ended, "sessions", len(ended))
	}
	if err != nil || !found {
		return
	}
	if _, err := n.client.Insert(ctx, jobs.ReclaimArgs{}, nil); err != nil {
		n.logger.WarnContext(ctx, "could not enqueue a reclaim for a dead node's lanes", "error", err)
		return
	}
	n.logger.InfoContext(ctx, "a dead node still holds drainers: reclaim enqueued")
}

// syncListeners makes the bound listeners match the lease. A node that lost
// the lease closes its listeners and connections at once: another node may
// be about to take over, and nothing it still had in hand can be stored
// (intake checks the lease in the storing transaction).
func (n *Node) syncListeners(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Read under n.mu: a stepdown closes the gate and then drains under
	// n.mu, so a bind decided on a stale gate finishes before that drain.
	serving := n.lease.Serving()
	switch {
	case serving && !n.bound:
		return n.bindLocked(ctx)
	case !serving && n.bound:
		hard, cancel := context.WithCancel(ctx)
		cancel()
		n.unbindLocked(hard)
	}
	return nil
}

// bindLocked binds every channel's inbound listener and starts polling
// every file channel's directory; all or none.
func (n *Node) bindLocked(ctx context.Context) error {
	cfg := n.Config() // the reloaded one, if the node was reloaded
	for i := range cfg.Channels {
		ch := &cfg.Channels[i]
		if ch.Inbound.MLLP == nil {
			continue
		}
		in := ch.Inbound.MLLP
		ln, err := net.Listen("tcp", in.Listen)
		if err != nil {
			n.unbindLocked(ctx)
			return fmt.Errorf("channel %q: listen on %s: %w", ch.Name, in.Listen, err)
		}
		n.listeners = append(n.listeners, n.serveListener(ctx, ch, ln))
	}
	n.publishGatesLocked()
	if err := n.startPollersLocked(ctx, cfg); err != nil {
		n.unbindLocked(ctx)
		return err
	}
	n.bound = true
	return nil
}

// UnbindListeners stops accepting, lets in-flight messages finish (stored and
// acknowledged) until ctx ends, closes every listener and stops polling. The listeners
// come back on the next lease edge or heartbeat if the node still holds the
// lease.
func (n *Node) UnbindListeners(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.unbindLocked(ctx)
}

func (n *Node) unbindLocked(ctx context.Context) {
	for _, bl := range n.listeners {
		if err := bl.server.Shutdown(ctx); err != nil {
			n.logger.WarnContext(ctx, "listener did not drain in time", "channel", bl.channel, "error", err)
		}
		if err := <-bl.done; err != nil && !errors.Is(err, mllp.ErrServerClosed) {
			n.logger.WarnContext(ctx, "listener ended with error", "channel", bl.channel, "error", err)
		}
		n.logger.InfoContext(ctx, "stopped listening", "channel", bl.channel)
	}
	n.listeners = nil
	n.publishGatesLocked()
	n.stopPollersLocked(ctx)
	n.bound = false
}

// ListenerAddrs returns the bound address of each channel's listener.
func (n *Node) ListenerAddrs() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]string{}
	for _, bl := range n.listeners {
		out[bl.channel] = bl.ln.Addr().String()
	}
	return out
}

// Stop stops the node gracefully: listeners first (no ACK after that),
// then each drainer finishes the row in hand and yields its lane, then the
// River client stops. Past StopTimeout, drainers still running are
// cancelled; their rows stay pending and are served again (at-least-once).
//
// Stop may be called more than once (a second signal, a deferred stop after
// an explicit one): later calls wait for the first and return its error.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() { n.stopErr = n.stop(ctx) })
	return n.stopErr
}

func (n *Node) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.StopTimeout)
	defer cancel()
	n.stopConfigWatch() // no reload may rebind listeners from here on
	if n.stopSync != nil {
		// Stop rebinding first; the lease keeps being renewed while the
		// listeners drain, so messages in flight can still be stored.
		n.stopSync()
		<-n.syncDone
	}
	n.UnbindListeners(ctx)
	n.stopAPI(ctx)
	if n.stopLease != nil {
		n.stopLease()
		n.leaseDone.Wait()
		n.lease.Release(context.WithoutCancel(ctx))
	}
	close(n.stopping)
	err := n.client.Stop(ctx)
	if err != nil {
		n.logger.WarnContext(ctx, "drainers did not stop in time, cancelling", "error", err)
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = n.client.StopAndCancel(cctx)
		ccancel()
	}
	if n.stopWake != nil {
		n.stopWake()
		<-n.wakeDone
	}
	n.senders.Close()
	n.refs.stopWatch()
	n.stopCertWatch()
	if n.stopBeat != nil {
		n.stopBeat()
		<-n.beatDone
		if lerr := n.membership.Leave(context.WithoutCancel(ctx)); lerr != nil {
			n.logger.WarnContext(ctx, "could not mark node as left", "error", lerr)
		}
	}
	n.closePools()
	return err
}

// checkPressure says once, at start, when the host's CPU pressure cannot
// be read (not Linux, or pressure stall information off in the kernel):
// drainers then never gather, as on a host with CPU to spare.
func (n *Node) checkPressure(ctx context.Context) {
	if n.pressure == nil {
		return
	}
	if err := n.pressure.Check(); err != nil {
		n.logger.InfoContext(ctx, "CPU pressure is not readable on this host; drainers will not gather", "error", err)
	}
}

// closePools closes the pools the node opened.
func (n *Node) closePools() {
	if n.clusterPool != nil {
		n.clusterPool.Close()
	}
	n.opts.Pool.Close()
}

// warnIfNotDurable logs, once at start, settings that let a crash lose
// what the server reported committed. With fsync or full_page_writes off
// (the server's), an acknowledged message is only as safe as the operating
// system's cache. With synchronous_commit off in the node's own sessions
// (only when the database URL names it: dbpool.DurableCommits turns it on
// otherwise), a commit returns before its flush, so a sender can hold an
// ACK for a message a crash of the server then loses.
func (n *Node) warnIfNotDurable(ctx context.Context) {
	var fsync, fpw, syncCommit string
	err := n.Pool().QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('full_page_writes'),
		current_setting('synchronous_commit')`).Scan(&fsync, &fpw, &syncCommit)
	if err != nil {
		n.logger.WarnContext(ctx, "could not read the database server's durability settings", "error", err)
		return
	}
	if fsync != "on" || fpw != "on" {
		n.logger.WarnContext(ctx, "the database server is not crash-safe: a crash of its machine can lose messages already acknowledged; set fsync and full_page_writes on",
			"fsync", fsync, "full_page_writes", fpw)
	}
	if syncCommit == "off" {
		n.logger.WarnContext(ctx, "the node's sessions commit without waiting for the flush: a crash of the database server can lose messages already acknowledged; remove synchronous_commit=off from the database URL",
			"synchronous_commit", syncCommit)
	}
}

// quietHandler raises the level of a library's logger: River reports
// routine producer statistics at info, which would drown a node's own log.
type quietHandler struct {
	slog.Handler
	min slog.Level
}

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(attrs), h.min}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name), h.min}
}

// riverLogger is the node's logger for River: warnings and errors only,
// unless the node logs at debug.
func riverLogger(l *slog.Logger) *slog.Logger {
	l = l.With("component", "river")
	if l.Enabled(context.Background(), slog.LevelDebug) {
		return l
	}
	return slog.New(quietHandler{Handler: l.Handler(), min: slog.LevelWarn})
}

// openConnsTimeout bounds openConns: a database that cannot open the
// pool's sessions in that time is slow enough that the node had better
// start and open the rest on demand.
const openConnsTimeout = 10 * time.Second

// openConns opens the pool's MaxConns connections one at a time, each
// readied by AfterConnect, and leaves them idle in the pool
// (Options.OpenConnsAtStart). Start runs it before the drainers start and
// the listeners bind, so each opened connection can be held until the
// pool is full (the next Acquire then opens a new one instead of taking it
// back), and no sender waits meanwhile. One at a time because twenty new
// sessions opened and readied at once take every core of a small database
// server for a moment: in CI (two cores shared with other test processes)
// that moment made a node's lease renewal miss its fence_timeout. It gives
// up, leaving the rest to open on demand, when ctx ends or after
// openConnsTimeout.
func (n *Node) openConns(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, openConnsTimeout)
	defer cancel()
	pool := n.opts.Pool
	max := pool.Config().MaxConns
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for pool.Stat().TotalConns() < max {
		c, err := pool.Acquire(ctx)
		if err != nil {
			n.logger.DebugContext(ctx, "opened fewer database sessions at start than the pool holds; the rest open on demand",
				"open", pool.Stat().TotalConns(), "max", max, "error", err)
			return
		}
		held = append(held, c)
	}
}
