package cpupressure

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPath is the host-wide CPU pressure file (Linux 4.20 and later,
// when the kernel has PSI enabled).
const DefaultPath = "/proc/pressure/cpu"

// The defaults NewGauge gives a Gauge: Window defaults to DefaultWindow
// (100ms), On to DefaultOn (0.40) and Off to DefaultOff (0.30). The package
// doc says why.
const (
	DefaultWindow = 100 * time.Millisecond
	DefaultOn     = 0.40
	DefaultOff    = 0.30
)

// Gauge reports Busy once a window's stall share is at least On, and stays
// busy until a window's share falls below Off, so that what acts on it (and
// lowers the load by acting) does not flap at the edge.
//
// It samples only when asked, at most once per Window: the share is the
// waiting since the previous sample over the time since then. An idle node
// that asks nothing reads nothing, and the first question after a quiet
// spell averages over that spell, which reads as not busy.
type Gauge struct {
	Path   string
	Window time.Duration
	On     float64
	Off    float64

	mu      sync.Mutex // one sampler at a time; others take the last verdict
	sampled bool
	at      time.Time
	total   int64
	failed  atomic.Bool
	busy    atomic.Bool
	share   atomic.Uint64 // the last window's share, in millionths
}

// NewGauge returns a gauge of the file at path with the default window and
// thresholds.
func NewGauge(path string) *Gauge {
	return &Gauge{Path: path, Window: DefaultWindow, On: DefaultOn, Off: DefaultOff}
}

// Check reads the file once and says why it cannot be used. A gauge whose
// file cannot be read is never busy.
func (g *Gauge) Check() error {
	_, err := readSome(g.Path)
	return err
}

// Busy reports whether the host's CPUs are contended, sampling when the
// last sample is a Window old. A nil gauge, or one whose file cannot be
// read, is never busy.
func (g *Gauge) Busy() bool {
	if g == nil || g.failed.Load() {
		return false
	}
	if g.mu.TryLock() {
		g.sample(time.Now())
		g.mu.Unlock()
	}
	return g.busy.Load()
}

// Share is the last window's stall share, 0 to 1 (more than 1 only across
// a window whose clock and the kernel's disagree).
func (g *Gauge) Share() float64 { return float64(g.share.Load()) / 1e6 }

// sample takes a window ending now, if the last one is a Window old.
func (g *Gauge) sample(now time.Time) {
	if g.sampled && now.Sub(g.at) < g.Window {
		return
	}
	total, err := readSome(g.Path)
	if err != nil {
		g.failed.Store(true)
		g.busy.Store(false)
		return
	}
	if g.sampled {
		g.observe(total-g.total, now.Sub(g.at))
	}
	g.sampled, g.at, g.total = true, now, total
}

// observe takes one window: stalled microseconds of waiting in elapsed.
func (g *Gauge) observe(stalled int64, elapsed time.Duration) {
	share := 0.0
	if elapsed > 0 {
		share = float64(time.Duration(stalled)*time.Microsecond) / float64(elapsed)
	}
	g.share.Store(uint64(math.Max(share, 0) * 1e6))
	switch {
	case share >= g.On:
		g.busy.Store(true)
	case share < g.Off:
		g.busy.Store(false)
	}
}

// Stalled is the "some" total of the file at path: how long, since boot,
// at least one task waited for a CPU.
func Stalled(path string) (time.Duration, error) {
	n, err := readSome(path)
	return time.Duration(n) * time.Microsecond, err
}

// readSome returns the "some" line's total: microseconds, since boot, in
// which at least one task waited for a CPU.
func readSome(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read CPU pressure: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, f := range fields[1:] {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("CPU pressure %s: total %q: %w", path, v, err)
				}
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("CPU pressure %s: no \"some ... total=\" line", path)
}
