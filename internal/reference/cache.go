package reference

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/tick"
)

// ErrNoSnapshot is returned by Lookup for a set that has no snapshot in this
// node's cache yet: not synced once, or not loaded yet. It is not the
// message's fault, so callers retry rather than dead-letter.
var ErrNoSnapshot = errors.New("has no snapshot yet")

// Snapshot is one version of a reference set as held in memory. It is
// immutable once loaded.
type Snapshot struct {
	Version int64
	Columns []string
	rows    map[string][]string
}

// Len is the number of keys.
func (s *Snapshot) Len() int { return len(s.rows) }

// Cache holds the live snapshot of every reference set in memory. Lookups
// read an immutable map through an atomic pointer, so they never wait for a
// refresh nor touch the database. It is safe for concurrent use.
type Cache struct {
	pool   *pgxpool.Pool
	keys   *crypt.Keyring
	logger *slog.Logger

	snaps atomic.Pointer[map[string]*Snapshot]
	// refreshMu serializes refreshes so two of them don't load the same
	// set twice or swap an older map over a newer one.
	refreshMu sync.Mutex
}

// NewCache returns an empty cache reading snapshots from pool and opening
// their values with kr (nil: encryption off); call Refresh to load it.
func NewCache(pool *pgxpool.Pool, kr *crypt.Keyring, logger *slog.Logger) *Cache {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Cache{pool: pool, keys: kr, logger: logger}
	c.snaps.Store(&map[string]*Snapshot{})
	return c
}

// Lookup returns column of key in set; column "" is the set's first value
// column. found is false when the set has no such key. An error means the
// lookup could not be answered: ErrNoSnapshot (retry later), or a column the
// snapshot lacks. Errors name the set and column, never the key.
func (c *Cache) Lookup(set, key, column string) (value string, found bool, err error) {
	s := (*c.snaps.Load())[set]
	if s == nil {
		return "", false, fmt.Errorf("reference set %q %w", set, ErrNoSnapshot)
	}
	i := 0
	if column != "" {
		if i = slices.Index(s.Columns, column); i < 0 {
			return "", false, fmt.Errorf("reference set %q has no column %q (columns: %s); fix the lookup's column or the set's source",
				set, column, strings.Join(s.Columns, ", "))
		}
	}
	row, ok := s.rows[key]
	if !ok {
		return "", false, nil
	}
	return row[i], true, nil
}

// Snapshot returns the cached snapshot of set, nil if none.
func (c *Cache) Snapshot(set string) *Snapshot {
	return (*c.snaps.Load())[set]
}

// Versions returns the version of every cached set.
func (c *Cache) Versions() map[string]int64 {
	out := make(map[string]int64)
	for name, s := range *c.snaps.Load() {
		out[name] = s.Version
	}
	return out
}

// Refresh reads the live version of every set (one small query) and loads
// from the database the rows of each set whose version differs from the
// cached one. It returns the sets it loaded. A set that fails to load keeps
// its cached snapshot; the error is returned after the others are loaded.
func (c *Cache) Refresh(ctx context.Context) ([]string, error) {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	live, err := ReferenceVersions(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	cur := *c.snaps.Load()
	next := maps.Clone(cur)
	var loaded []string
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(live)) {
		if s := cur[name]; s != nil && s.Version == live[name] {
			continue
		}
		version, snap, err := LoadReferenceSnapshot(ctx, c.pool, c.keys, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if version == 0 {
			continue
		}
		s := &Snapshot{Version: version, Columns: snap.Columns, rows: make(map[string][]string, len(snap.Rows))}
		for _, r := range snap.Rows {
			s.rows[r.Key] = r.Values
		}
		next[name] = s
		loaded = append(loaded, name)
	}
	if len(loaded) > 0 {
		c.snaps.Store(&next)
		for _, name := range loaded {
			c.logger.InfoContext(ctx, "reference set loaded", "set", name, "version", next[name].Version, "rows", next[name].Len())
		}
	}
	return loaded, errors.Join(errs...)
}

// Watch refreshes the cache every interval until ctx ends: the read-through
// that makes a snapshot synced on any node visible on this one within one
// interval. Failures are logged and retried on the next tick; the cache
// keeps serving what it has.
func (c *Cache) Watch(ctx context.Context, every time.Duration) {
	tick.Every(ctx, every, func(ctx context.Context) {
		if _, err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			c.logger.WarnContext(ctx, "reference cache refresh failed; serving the snapshots held", "error", err)
		}
	})
}
