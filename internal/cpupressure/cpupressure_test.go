package cpupressure

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file in the kernel's format, whose "some" total the test advances as
// the kernel would: by the microseconds in which a task waited.
type fakePSI struct {
	t     *testing.T
	path  string
	total int64
}

func newFakePSI(t *testing.T) *fakePSI {
	f := &fakePSI{t: t, path: filepath.Join(t.TempDir(), "cpu")}
	f.write()
	return f
}

func (f *fakePSI) stall(d time.Duration) {
	f.total += d.Microseconds()
	f.write()
}

func (f *fakePSI) write() {
	body := fmt.Sprintf("some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", f.total)
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil { // the gauge never reads half a file
		f.t.Fatal(err)
	}
}

// The gauge turns busy when a window's stall share reaches On, stays busy
// while it is between Off and On, and turns idle below Off.
func TestGaugeFollowsStallShareWithHysteresis(t *testing.T) {
	g := &Gauge{On: 0.6, Off: 0.45}
	window := 100 * time.Millisecond
	for i, step := range []struct {
		share float64
		want  bool
	}{
		{0.20, false},
		{0.59, false}, // below On
		{0.60, true},
		{0.52, true}, // above Off: stays busy
		{0.45, true},
		{0.44, false},
		{0.52, false}, // below On: stays idle
		{0.95, true},
		{0.00, false},
	} {
		g.observe(int64(step.share*float64(window.Microseconds())), window)
		if got := g.busy.Load(); got != step.want {
			t.Errorf("step %d: share %.2f: busy=%v, want %v", i, step.share, got, step.want)
		}
		if got := g.Share(); got < step.share-0.001 || got > step.share+0.001 {
			t.Errorf("step %d: Share() = %.3f, want %.2f", i, got, step.share)
		}
	}
}

// The gauge samples the kernel's file when asked, at most once a window,
// and judges the waiting since its previous sample.
func TestGaugeSamplesTheKernelsFileWhenAsked(t *testing.T) {
	f := newFakePSI(t)
	g := &Gauge{Path: f.path, Window: 100 * time.Millisecond, On: 0.6, Off: 0.45}
	t0 := time.Unix(1_000_000, 0)
	g.sample(t0)
	if g.busy.Load() {
		t.Fatal("busy after one sample: there is no window yet")
	}
	f.stall(80 * time.Millisecond)
	g.sample(t0.Add(50 * time.Millisecond)) // within the window: not a sample
	if g.busy.Load() {
		t.Fatal("sampled before the window was over")
	}
	g.sample(t0.Add(100 * time.Millisecond)) // 80ms of waiting in 100ms
	if !g.busy.Load() || g.Share() < 0.79 || g.Share() > 0.81 {
		t.Fatalf("after 80ms of waiting in 100ms: busy=%v share=%.2f, want busy at 0.80", g.busy.Load(), g.Share())
	}
	// A quiet spell, asked about only at its end, averages out.
	f.stall(100 * time.Millisecond)
	g.sample(t0.Add(10 * time.Second))
	if g.busy.Load() {
		t.Fatalf("busy at share %.3f after a quiet spell", g.Share())
	}

	// Busy samples on its own (its first window starts from the fake
	// clock's last sample, long ago: not busy), and with more waiting than
	// wall time has passed, the next window is busy whenever it comes.
	g.Window = time.Millisecond
	g.Busy()
	f.stall(time.Hour)
	time.Sleep(2 * time.Millisecond)
	if !g.Busy() {
		t.Fatalf("not busy after an hour of waiting (share %.2f)", g.Share())
	}
}

// A host without pressure stall information leaves the gauge never busy,
// and Check says why.
func TestGaugeWithoutPSIIsNeverBusy(t *testing.T) {
	for name, body := range map[string]*string{"missing": nil, "garbled": ptr("full total=12\n"), "bad number": ptr("some total=x\n")} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cpu")
			if body != nil {
				if err := os.WriteFile(path, []byte(*body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			g := NewGauge(path)
			if err := g.Check(); err == nil {
				t.Fatal("Check returned nil for an unreadable pressure file")
			}
			for range 3 {
				if g.Busy() {
					t.Fatal("busy without a pressure file")
				}
			}
		})
	}
	var g *Gauge
	if g.Busy() {
		t.Fatal("a nil gauge is busy")
	}
}

func ptr(s string) *string { return &s }
