package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mefor/mefor/internal/admin"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/ops"
)

type runCmd struct {
	Config          string        `required:"" type:"existingfile" placeholder:"FILE" help:"Channel config file."`
	NodeID          string        `name:"node-id" placeholder:"ID" help:"Name of this node (default host:pid:random)."`
	Migrate         bool          `help:"Apply pending migrations before starting (default: refuse to start on an old schema)."`
	StopTimeout     time.Duration `name:"stop-timeout" default:"30s" help:"On SIGTERM/SIGINT, how long drainers may take to finish their current row before being cancelled."`
	AdminListen     string        `name:"admin-listen" default:"127.0.0.1:8575" placeholder:"HOST:PORT" help:"Address of the admin HTTP endpoints (/healthz, /metrics, /cluster/status, /cluster/nodes, /certificates); empty disables them. Give each node on one host its own."`
	ReclaimInterval time.Duration `name:"reclaim-interval" placeholder:"DURATION" help:"How often River's leader re-activates lanes left with backlog and no drainer; overrides maintenance.reclaim.schedule (default 5s)."`
	// AllowPlaintextStorage lifts checkPlaintextStorage's refusal.
	// ListenerPriority overrides cluster.listener_priority; -1: not given.
	ListenerPriority      int  `name:"listener-priority" default:"-1" placeholder:"N" help:"Rank of this node for the listener lease, overriding cluster.listener_priority (default 1): it takes the listeners over only when no live node of a higher priority can; 0 means never (a DR site, a processing-only node)."`
	AllowPlaintextStorage bool `name:"allow-plaintext-storage" help:"Run without encryption keys although the database is on another host: message content is then stored there in plaintext. Refused by default."`
}

func (c *runCmd) Help() string {
	return `Starts a node: the River client working the route, transform and deliver
queues, the inbound MLLP listeners and directory pollers of every channel,
and the reclaim job.

Several nodes may run the same config against one database. All of them
process; only the holder of the listener lease binds the inbound listeners
and polls the channels' directories,
and the others stay warm and take over within lease_ttl plus a heartbeat when
it dies, or within about a heartbeat after 'mefor stepdown'. A holder that
cannot renew the lease for fence_timeout stops listening on its own, before
the lease can pass to another node. 'mefor nodes' shows who holds it.
--listener-priority (or cluster.listener_priority) ranks the nodes: one takes
the listeners over only when no live node of a higher priority can (or the
lease has stayed free for lease_ttl since), and 0 never takes them. Two
nodes on one host need their own --node-id (default host:pid:random is
unique) and --admin-listen.

On SIGTERM or SIGINT the node stops accepting connections first (no ACK is
sent after that), lets each drainer finish the row in hand, and exits within
--stop-timeout plus about five seconds; rows not finished stay queued and are
served again by the next node to run.

A node reads the certificate files its TLS listeners and destinations name
when it starts, and refuses to start if one is unreadable, does not match its
key or has expired, naming it; 'mefor reload' re-reads them (renewed files
apply to new connections). GET /certificates on --admin-listen lists them.

GET /metrics on --admin-listen serves the node's Prometheus metrics (see
docs/monitoring.md, "Metrics"; examples/monitoring has a scrape config, alert
rules and a Grafana dashboard).

Examples:
  mefor run --config examples/quickstart/mefor.yaml --migrate
  mefor run --config mefor.yaml --node-id a --admin-listen 127.0.0.1:8576
  DATABASE_URL='postgres://mefor:secret@db.example.org/mefor?sslmode=verify-full&sslrootcert=/etc/mefor/tls/db-ca.crt' \
    mefor run --config /etc/mefor/mefor.yaml`
}

func (c *runCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		return err
	}
	kr, err := g.configKeyring(cfg)
	if err != nil {
		return err
	}
	if err := checkPlaintextStorage(g.DatabaseURL, kr.Enabled(), c.AllowPlaintextStorage); err != nil {
		return err
	}
	var priority *int
	if c.ListenerPriority >= 0 {
		if c.ListenerPriority > config.MaxListenerPriority {
			return fmt.Errorf("--listener-priority %d: must be from 0 (never take the listeners) to %d", c.ListenerPriority, config.MaxListenerPriority)
		}
		priority = &c.ListenerPriority
	} else if c.ListenerPriority != -1 {
		return fmt.Errorf("--listener-priority %d: must be from 0 (never take the listeners) to %d", c.ListenerPriority, config.MaxListenerPriority)
	}
	nodeID := c.NodeID
	if nodeID == "" {
		nodeID = defaultNodeID()
	}
	// The node names its own sessions and bounds their idle transactions
	// (engine.New); this pool serves migrations and the admin endpoints.
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if c.Migrate {
		if _, err := migrations.Migrate(ctx, pool, g.logger); err != nil {
			return err
		}
		if _, err := migrations.ApplyRoles(ctx, pool, g.logger); err != nil {
			return err
		}
	} else if pending, err := migrations.Pending(ctx, pool); err != nil {
		return err
	} else if pending {
		return errors.New("the database schema is not up to date: run 'mefor migrate' (or start with --migrate)")
	}

	logger := g.logger.With("node", nodeID)
	if kr.Enabled() {
		logger.Info("encryption at rest on", "active_key", kr.ActiveID(), "keys", kr)
	} else {
		logger.Warn("encryption at rest off: message content is stored in plaintext (set MEFOR_ENCRYPTION_KEYS, or name the keys in the config's encryption: keys)")
	}
	auditKeys, err := ops.AuditKeysFromEnv(g.env())
	if err != nil {
		return err
	}
	if auditKeys == nil {
		logger.Warn("MEFOR_AUDIT_KEY is not set: audit anchors are taken unsigned, so a database superuser could rewrite the audit log unseen (see docs/security.md)")
	}
	node, err := engine.New(engine.Options{
		Config: cfg, Pool: pool, Logger: logger, NodeID: nodeID,
		StopTimeout: c.StopTimeout, ReclaimInterval: c.ReclaimInterval, ListenerPriority: priority, Keys: kr, AuditKeys: auditKeys,
		OpenConnsAtStart: !strings.Contains(g.DatabaseURL, "pool_min_conns"),
		APIReads:         ops.APIReads{Pool: pool, Keys: kr},
		APIActions:       ops.APIActions{Pool: pool, Keys: kr},
	})
	if err != nil {
		return err
	}
	var adm *admin.Server
	if c.AdminListen != "" {
		adm = &admin.Server{Pool: pool, NodeID: nodeID, Serving: node.Lease().Serving, Certificates: node.Certificates,
			Metrics: node.MetricsHandler(), Logger: logger}
		if err := adm.Start(c.AdminListen); err != nil {
			return fmt.Errorf("admin HTTP listener on %s: %w (pick another with --admin-listen, or disable it with --admin-listen='')", c.AdminListen, err)
		}
		logger.Info("admin HTTP listening", "addr", adm.Addr())
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	logger.Info("node running", "config", c.Config, "config_hash", cfg.Hash()[:12])
	reloadOnHangup(ctx, node, logger)
	logger.Info("stopping: listeners first, then drainers", "stop_timeout", c.StopTimeout)
	if err := node.Stop(context.Background()); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if adm != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = adm.Stop(sctx)
		cancel()
	}
	logger.Info("stopped")
	return nil
}

func defaultNodeID() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}

// reloadOnHangup reloads the node's config file at each SIGHUP until ctx
// ends. A bad file changes nothing: the node logs why and records it on its
// row for 'mefor status'; a good one is announced to the other nodes.
func reloadOnHangup(ctx context.Context, node *engine.Node, logger *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		logger.Info("SIGHUP: reloading the config file", "config", node.Config().File)
		if _, err := node.Reload(ctx); err != nil {
			logger.Error("config reload failed; still running the previous config", "error", err)
		}
	}
}
