package api

import (
	"sync"
	"time"
)

// limiter allows n events per window per key (a source address), in
// fixed windows: simple, and enough to stop one address from guessing
// passwords at speed. The lockout bounds guesses per account; this bounds
// them per address across accounts.
type limiter struct {
	n      int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*slot
}

type slot struct {
	start time.Time
	count int
}

// maxKeys bounds the addresses remembered; past it, old windows are
// dropped first.
const maxKeys = 65536

func newLimiter(n int, window time.Duration) *limiter {
	return &limiter{n: n, window: window, now: time.Now, seen: map[string]*slot{}}
}

// allow counts an event of key and reports whether it is within the limit.
func (l *limiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	s, ok := l.seen[key]
	if !ok || now.Sub(s.start) >= l.window {
		if !ok && len(l.seen) >= maxKeys {
			for k, old := range l.seen {
				if now.Sub(old.start) >= l.window {
					delete(l.seen, k)
				}
			}
		}
		s = &slot{start: now}
		l.seen[key] = s
	}
	s.count++
	return s.count <= l.n
}
