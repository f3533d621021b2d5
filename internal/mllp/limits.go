package mllp

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// frameKey is the context key of the frame a handler is answering.
type frameKey struct{}

// frameMarks is what a handler may say about the frame it answers.
type frameMarks struct {
	rejected atomic.Bool
}

// Reject marks the frame whose handler got ctx as rejected: the handler
// still returns the answer to send (a negative acknowledgement, say), and
// the frame counts toward the server's MaxRejectsInARow. A frame whose
// handler does not call Reject resets that count. Outside a handler's
// context it does nothing.
func Reject(ctx context.Context) {
	if m, ok := ctx.Value(frameKey{}).(*frameMarks); ok {
		m.rejected.Store(true)
	}
}

// pacer spaces the frames a listener reads, all its connections together,
// to a rate with a burst of one second's worth: a generic cell rate
// algorithm, which needs only the time the next frame is due.
type pacer struct {
	interval time.Duration
	burst    time.Duration // how far ahead of its due time a frame may be read

	mu  sync.Mutex
	tat time.Time // when the next frame is due at the steady rate
}

func newPacer(perSecond float64) *pacer {
	if perSecond <= 0 {
		return nil
	}
	interval := time.Duration(float64(time.Second) / perSecond)
	burst := max(math.Ceil(perSecond), 1)
	return &pacer{interval: interval, burst: time.Duration(burst-1) * interval}
}

// reserve takes the next frame's place and returns how long to wait before
// reading it. A place is never given back: a connection that goes away
// while it waits leaves the listener slower by one frame, never faster.
func (p *pacer) reserve(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	tat := p.tat
	if tat.Before(now) {
		tat = now
	}
	p.tat = tat.Add(p.interval)
	return max(tat.Add(-p.burst).Sub(now), 0)
}
