package state

import (
	"sync"
)

// DefaultCacheSize bounds a node's cache, in keys.
const DefaultCacheSize = 100_000

// Cache is a node's copy of committed state, shared by its lanes. It may be
// stale or incomplete in any way: every value read from it is checked by
// version in the hand-off, so the cache decides only how often a batch runs
// again, never what commits. It is safe for concurrent use.
type Cache struct {
	mu      sync.RWMutex
	entries map[Key]Entry
	max     int
}

// NewCache returns an empty cache holding at most max keys (DefaultCacheSize
// when max <= 0).
func NewCache(max int) *Cache {
	if max <= 0 {
		max = DefaultCacheSize
	}
	return &Cache{entries: map[Key]Entry{}, max: max}
}

// Get implements Source.
func (c *Cache) Get(k Key) (Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.entries[k]
	return e, ok
}

// Put records committed entries (absent ones too, with version 0), keeping
// for each key the highest version seen: entries from an older read never
// overwrite a newer commit.
func (c *Cache) Put(entries map[Key]Entry) {
	if len(entries) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range entries {
		if old, ok := c.entries[k]; ok && old.Version > e.Version && e.Version != 0 {
			continue
		}
		if _, ok := c.entries[k]; !ok && len(c.entries) >= c.max {
			c.evict()
		}
		c.entries[k] = e
	}
}

// Forget drops keys, so their next read assumes absent and is checked.
func (c *Cache) Forget(keys ...Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.entries, k)
	}
}

// Len is the number of keys held.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// evict drops about a quarter of the entries, whichever the map yields
// first. Dropping a live key costs one re-run of a batch, so a cheap
// eviction beats bookkeeping on every read. Callers hold mu.
func (c *Cache) evict() {
	n := len(c.entries) / 4
	if n < 1 {
		n = 1
	}
	for k := range c.entries {
		delete(c.entries, k)
		n--
		if n == 0 {
			return
		}
	}
}

// Map is a fixed Source, for dry runs and tests: every key it lacks is
// absent.
type Map map[Key]Entry

// Get implements Source.
func (m Map) Get(k Key) (Entry, bool) {
	e, ok := m[k]
	return e, ok
}
