package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/migrations"
)

type runCmd struct {
	Config          string        `required:"" type:"existingfile" placeholder:"FILE" help:"Channel config file."`
	NodeID          string        `name:"node-id" placeholder:"ID" help:"Name of this node (default host:pid:random)."`
	Migrate         bool          `help:"Apply pending migrations before starting (default: refuse to start on an old schema)."`
	StopTimeout     time.Duration `name:"stop-timeout" default:"30s" help:"On SIGTERM/SIGINT, how long drainers may take to finish their current row before being cancelled."`
	ReclaimInterval time.Duration `name:"reclaim-interval" default:"5s" help:"How often River's leader re-activates lanes left with backlog and no drainer."`
}

func (c *runCmd) Help() string {
	return `Starts a node: the River client working the route, transform and deliver
queues, the inbound MLLP listeners of every channel, and the reclaim job.
Several nodes may run the same config against one database.

On SIGTERM or SIGINT the node stops accepting connections first (no ACK is
sent after that), lets each drainer finish the row in hand, and exits within
--stop-timeout plus about five seconds; rows not finished stay queued and are
served again by the next node to run.

Examples:
  mefor run --config examples/quickstart/mefor.yaml --migrate
  DATABASE_URL=postgres://mefor:secret@db/mefor mefor run --config /etc/mefor/mefor.yaml`
}

func (c *runCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		return err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if c.Migrate {
		if _, err := migrations.Migrate(ctx, pool, g.logger); err != nil {
			return err
		}
	} else if pending, err := migrations.Pending(ctx, pool); err != nil {
		return err
	} else if pending {
		return errors.New("the database schema is not up to date: run 'mefor migrate' (or start with --migrate)")
	}

	nodeID := c.NodeID
	if nodeID == "" {
		nodeID = defaultNodeID()
	}
	logger := g.logger.With("node", nodeID)
	node, err := engine.New(engine.Options{
		Config: cfg, Pool: pool, Logger: logger, NodeID: nodeID,
		StopTimeout: c.StopTimeout, ReclaimInterval: c.ReclaimInterval,
	})
	if err != nil {
		return err
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	logger.Info("node running", "config", c.Config, "config_hash", cfg.Hash()[:12])
	<-ctx.Done()
	logger.Info("stopping: listeners first, then drainers", "stop_timeout", c.StopTimeout)
	if err := node.Stop(context.Background()); err != nil {
		return fmt.Errorf("stop: %w", err)
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
