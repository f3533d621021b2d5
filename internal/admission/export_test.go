package admission

import "time"

// SetClock makes the gate's refusal log read the time from now.
func (g *Gate) SetClock(now func() time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now = now
}
