package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/workers"
)

// references is a node's side of the reference sets: the in-memory cache
// lookups read, the watcher that keeps it at the database's versions, and
// the sync worker.
//
// A node loads every snapshot before its River client starts, so no message
// is transformed against an empty cache. A set that has no snapshot at all
// yet (never synced, or every sync failed) gets a sync enqueued at start,
// and until one succeeds its lookups are retried rather than dead-lettered
// (handler.ErrNotReady holds the routed lane and snoozes its drainer).
type references struct {
	cache  *reference.Cache
	syncer *reference.Syncer
	every  time.Duration
	logger *slog.Logger

	stop context.CancelFunc
	done chan struct{}
}

func newReferences(opts Options) *references {
	return &references{
		cache:  reference.NewCache(opts.Pool, opts.Keys, opts.Logger),
		syncer: &reference.Syncer{Pool: opts.Pool, NodeID: opts.NodeID, Keys: opts.Keys},
		every:  opts.Config.Cluster.Heartbeat,
		logger: opts.Logger,
	}
}

// mapOptions give map handlers the cache for their lookups.
func (r *references) mapOptions() []handler.MapOption {
	return []handler.MapOption{handler.WithLookup(cacheLookup{r.cache})}
}

// worker is the node's reference-sync worker. After a sync it refreshes
// this node's cache at once; the others follow within a heartbeat.
func (r *references) worker(cfg func() *config.Config) *workers.ReferenceSyncWorker {
	return &workers.ReferenceSyncWorker{
		Config: cfg,
		Syncer: r.syncer,
		Logger: r.logger,
		Refresh: func(ctx context.Context) {
			if _, err := r.cache.Refresh(ctx); err != nil {
				r.logger.WarnContext(ctx, "reference cache refresh after sync failed", "error", err)
			}
		},
	}
}

// start loads the current snapshots, asks for a sync of every configured
// set that has none, and starts the watcher. Call it before the River
// client starts.
func (r *references) start(ctx context.Context, cfg *config.Config, client *river.Client[pgx.Tx]) error {
	if _, err := r.cache.Refresh(ctx); err != nil {
		return fmt.Errorf("load reference sets: %w", err)
	}
	for _, set := range cfg.ReferenceSets {
		if r.cache.Snapshot(set.Name) != nil {
			continue
		}
		// Unique by set: nodes starting together enqueue one sync.
		if _, err := client.Insert(ctx, jobs.ReferenceSyncArgs{Set: set.Name}, nil); err != nil {
			return fmt.Errorf("enqueue first sync of reference set %s: %w", set.Name, err)
		}
		r.logger.InfoContext(ctx, "reference set has no snapshot yet; sync enqueued, its lookups wait for it", "set", set.Name)
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop, r.done = stop, make(chan struct{})
	go func() {
		defer close(r.done)
		r.cache.Watch(wctx, r.every)
	}()
	return nil
}

// stopWatch stops the watcher, if it was started.
func (r *references) stopWatch() {
	if r.stop != nil {
		r.stop()
		<-r.done
	}
}

// cacheLookup answers handler lookups from the cache, telling the handler
// that a set without a snapshot is a wait, not a failure of the message.
type cacheLookup struct{ c *reference.Cache }

func (l cacheLookup) Lookup(set, key, column string) (string, bool, error) {
	v, found, err := l.c.Lookup(set, key, column)
	if errors.Is(err, reference.ErrNoSnapshot) {
		err = fmt.Errorf("%w (%w)", err, handler.ErrNotReady)
	}
	return v, found, err
}

// ReferenceCache is the node's reference cache, for tests and status.
func (n *Node) ReferenceCache() *reference.Cache { return n.refs.cache }
