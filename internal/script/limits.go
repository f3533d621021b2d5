package script

import (
	"runtime/metrics"
	"sync"
	"time"

	"github.com/dlclark/regexp2/v2"
)

// goja offers no bound on a run's allocations and no match timeout of its
// own: these are the two limits besides the handler's timeout.

// regexMatchTimeout bounds one match of a backtracking regular expression.
// goja runs a pattern with lookaround or backreferences on regexp2, which
// can backtrack for longer than any timeout, and the interrupt is only
// seen when the match returns. goja fixes a pattern's match timeout from
// regexp2.DefaultMatchTimeout when it compiles it, and that is the only
// setting it reads, so it is set once, here, before any script can run.
// goja reports an abandoned match as no match, which would silently change
// a transform's output, so the bound is the default handler timeout: for
// any handler timeout up to it, a match is abandoned only after the call's
// interrupt is due, and the call then fails with a timeout instead of
// going on with a wrong answer. Defaults to 1s.
const regexMatchTimeout = time.Second

func init() {
	regexp2.DefaultMatchTimeout = regexMatchTimeout
}

// DefaultMaxHeapGrowth is how much the live heap may grow during one call
// before the call is interrupted.
const DefaultMaxHeapGrowth = 256 << 20

// heapCheckEvery is how often a running call's heap is checked. A call
// that ends sooner costs no check at all.
const heapCheckEvery = 10 * time.Millisecond

// watchHeap calls over once the process's live heap (as of the last
// collection) has grown by more than limit since the call began, checking
// every heapCheckEvery until stop is called. It is a bound on the node's
// memory, not an account of the script's: it counts what other goroutines
// allocate meanwhile too, and it lags by a collection, which a runaway
// allocation brings about quickly.
func watchHeap(limit uint64, over func()) (stop func()) {
	start := liveHeap()
	var (
		mu    sync.Mutex
		done  bool
		timer *time.Timer
	)
	var check func()
	check = func() {
		if liveHeap() > start+limit {
			over()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(heapCheckEvery, check)
		}
	}
	mu.Lock()
	timer = time.AfterFunc(heapCheckEvery, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		done = true
		timer.Stop()
	}
}

// liveHeap is the heap in use by live objects as of the last collection.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
