package engine

import (
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

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/workers"
)

// Options configure a node.
type Options struct {
	Config *config.Config
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// NodeID names this node in River and in logs.
	NodeID string
	// Limits bound each drainer execution; zero means workers.DefaultLimits.
	Limits workers.Limits
	// ReclaimInterval is how often River's leader sweeps for stranded
	// lanes; zero means 5s.
	ReclaimInterval time.Duration
	// StopTimeout bounds a graceful stop; past it running drainers are
	// cancelled. Zero means 30s.
	StopTimeout time.Duration
	// MaxWorkers per stage queue; zero means a default.
	IngressWorkers, RoutedWorkers, OutboundWorkers int
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

	membership *leader.Membership
	stopBeat   context.CancelFunc
	beatDone   chan struct{}

	mu        sync.Mutex
	listeners []*boundListener
}

type boundListener struct {
	channel string
	server  *mllp.Server
	ln      net.Listener
	done    chan error
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
	if opts.ReclaimInterval == 0 {
		opts.ReclaimInterval = 5 * time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 30 * time.Second
	}
	n := &Node{opts: opts, logger: opts.Logger, senders: connector.NewPool(), stopping: make(chan struct{})}
	g, err := NewGraph(opts.Config)
	if err != nil {
		return nil, err
	}
	n.graph.Store(g)

	wake := workers.NewWake()
	deps := &workers.Deps{
		Wake:     wake,
		Pool:     opts.Pool,
		Graph:    func() workers.Graph { return n.graph.Load() },
		Senders:  n.senders,
		Limits:   opts.Limits,
		Logger:   opts.Logger,
		Stopping: n.stopping,
		// A node silent this long is dead: reclaim frees its drainers.
		NodeTimeout: opts.Config.Cluster.NodeTimeout,
	}
	n.membership = &leader.Membership{
		Pool: opts.Pool, NodeID: opts.NodeID, Heartbeat: opts.Config.Cluster.Heartbeat, Logger: opts.Logger,
	}
	sendTimeout := maxSendTimeout(opts.Config)
	w := river.NewWorkers()
	river.AddWorker(w, &workers.IngressWorker{Deps: deps})
	river.AddWorker(w, &workers.RoutedWorker{Deps: deps})
	river.AddWorker(w, &workers.OutboundWorker{Deps: deps, SendTimeout: sendTimeout})
	river.AddWorker(w, &workers.ReclaimWorker{Deps: deps})

	// A drainer legitimately runs for a slice plus one slow send; River
	// must not rescue it before that, but should soon after (the default
	// is an hour, far too long for a blocked lane).
	jobTimeout := opts.Limits.Slice + sendTimeout + 30*time.Second
	client, err := river.NewClient(riverpgxv5.New(opts.Pool), &river.Config{
		ID:     opts.NodeID,
		Logger: riverLogger(opts.Logger),
		Queues: map[string]river.QueueConfig{
			jobs.QueueIngress:     {MaxWorkers: or(opts.IngressWorkers, 50)},
			jobs.QueueRouted:      {MaxWorkers: or(opts.RoutedWorkers, 50)},
			jobs.QueueOutbound:    {MaxWorkers: or(opts.OutboundWorkers, 500)},
			jobs.QueueMaintenance: {MaxWorkers: 2},
		},
		Workers:              w,
		JobTimeout:           jobTimeout,
		RescueStuckJobsAfter: jobTimeout + 10*time.Second,
		// A newly activated lane should start within milliseconds.
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 200 * time.Millisecond,
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(opts.ReclaimInterval),
				func() (river.JobArgs, *river.InsertOpts) { return jobs.ReclaimArgs{}, nil },
				&river.PeriodicJobOpts{RunOnStart: true}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	n.client = client
	n.intake = &Intake{Pool: opts.Pool, Inserter: client, Logger: opts.Logger, Wake: wake}
	return n, nil
}

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
	}
	return longest
}

// Client is the node's River client (for inserting jobs, e.g. in tests).
func (n *Node) Client() *river.Client[pgx.Tx] { return n.client }

// Intake is the node's intake, for other sources than its listeners.
func (n *Node) Intake() *Intake { return n.intake }

// Start dead-letters rows the config can no longer serve, starts the River
// client and binds the inbound listeners.
func (n *Node) Start(ctx context.Context) error {
	cfg := n.opts.Config
	known := store.Known{Handlers: []string{"passthrough"}}
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
	dead, err := store.DeadLetterOrphans(ctx, n.opts.Pool, known)
	if err != nil {
		return err
	}
	if dead > 0 {
		n.logger.WarnContext(ctx, "dead-lettered queued rows the config no longer serves", "rows", dead)
	}

	if err := n.membership.Join(ctx); err != nil {
		return err
	}
	beatCtx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	n.stopBeat, n.beatDone = stopBeat, make(chan struct{})
	go func() {
		defer close(n.beatDone)
		n.membership.Run(beatCtx)
	}()

	if err := n.client.Start(ctx); err != nil {
		return fmt.Errorf("start River client: %w", err)
	}
	return n.BindListeners(ctx)
}

// BindListeners binds every channel's inbound listener.
func (n *Node) BindListeners(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.listeners) > 0 {
		return nil
	}
	for i := range n.opts.Config.Channels {
		ch := &n.opts.Config.Channels[i]
		if ch.Inbound.MLLP == nil {
			continue
		}
		in := ch.Inbound.MLLP
		ln, err := net.Listen("tcp", in.Listen)
		if err != nil {
			n.unbindLocked(ctx)
			return fmt.Errorf("channel %q: listen on %s: %w", ch.Name, in.Listen, err)
		}
		srv := &mllp.Server{
			Handler:      n.intake.MLLPHandler(ch),
			MaxFrameSize: int(in.MaxFrameSize),
			ReadTimeout:  in.ReadTimeout,
			IdleTimeout:  in.IdleTimeout,
			OnOversize:   n.intake.OversizeACK(int(in.MaxFrameSize)),
			Logger:       n.logger.With("channel", ch.Name),
		}
		bl := &boundListener{channel: ch.Name, server: srv, ln: ln, done: make(chan error, 1)}
		go func() { bl.done <- srv.Serve(ln) }()
		n.listeners = append(n.listeners, bl)
		n.logger.InfoContext(ctx, "listening", "channel", ch.Name, "addr", ln.Addr().String())
	}
	return nil
}

// UnbindListeners stops accepting, lets in-flight messages finish (stored and
// acknowledged) and closes every listener.
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
func (n *Node) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.StopTimeout)
	defer cancel()
	n.UnbindListeners(ctx)
	close(n.stopping)
	err := n.client.Stop(ctx)
	if err != nil {
		n.logger.WarnContext(ctx, "drainers did not stop in time, cancelling", "error", err)
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = n.client.StopAndCancel(cctx)
		ccancel()
	}
	n.senders.Close()
	if n.stopBeat != nil {
		n.stopBeat()
		<-n.beatDone
		if lerr := n.membership.Leave(context.WithoutCancel(ctx)); lerr != nil {
			n.logger.WarnContext(ctx, "could not mark node as left", "error", lerr)
		}
	}
	return err
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
