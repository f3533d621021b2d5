package engine_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Drainers of several lanes woken while a lane read is in flight read
// their lanes together, in one round trip, once it ends; each lane still
// delivers its own messages, in order, once. With reads alone, the other
// lanes do not wait for the read held.
func TestLaneReadsOfSeveralLanesShareARoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		alone bool
	}{{"shared", false}, {"alone", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			partners := newPartners(t, 4)
			cfg, listens := channelsTo(t, partners...)
			n := cluster.StartNode(t, db, cfg, func(o *engine.Options) {
				o.Limits.Linger = time.Minute // every drainer lingers through the test
				o.ReadsAlone = tc.alone
			})
			for i, l := range listens {
				send(t, l, adt(fmt.Sprintf("W%d", i), "P1"))
			}
			fixtures.Eventually(t, 30*time.Second, "W0 to W3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 4 })

			// The next read (c0's ingress drainer, woken by S0) is held.
			s0 := newGate(t)
			defer s0.let()
			var mu sync.Mutex
			var turns []int
			engine.SetReadHook(n, func(reads int) {
				mu.Lock()
				turns = append(turns, reads)
				mu.Unlock()
				s0.hold()
			})
			send(t, listens[0], adt("S0", "P1"))
			if !tc.alone {
				<-s0.arrived
			}
			for i := 1; i < 4; i++ {
				send(t, listens[i], adt(fmt.Sprintf("S%d", i), "P1"))
			}
			if tc.alone {
				fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed, nobody waiting", func() bool {
					return countStatus(t, db, pipeline.StatusProcessed) == 8
				})
			} else {
				fixtures.Eventually(t, 30*time.Second, "S1 to S3's reads waiting for S0's", func() bool { return engine.WaitingReads(n) == 3 })
				time.Sleep(100 * time.Millisecond)
				if got := countStatus(t, db, pipeline.StatusProcessed); got != 4 {
					t.Errorf("%d messages processed while the reads waited, want the 4 of the warm-up", got)
				}
				s0.let()
				fixtures.Eventually(t, 30*time.Second, "S0 to S3 processed", func() bool { return countStatus(t, db, pipeline.StatusProcessed) == 8 })
			}
			for i, p := range partners {
				if got := p.acceptedIDs(); !slices.Equal(got, []string{fmt.Sprintf("W%d", i), fmt.Sprintf("S%d", i)}) {
					t.Errorf("d%d's partner accepted %v, want W%d then S%d once each", i, got, i, i)
				}
			}
			if tc.alone {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if len(turns) < 2 || turns[0] != 1 || turns[1] != 3 {
				t.Errorf("read turns carried %v lanes, want S0's alone, then S1 to S3's together", turns)
			}
			if shared := value(gatherMetrics(t, n), "mefor_lane_reads_shared_total", "stage", "ingress"); shared < 3 {
				t.Errorf("mefor_lane_reads_shared_total{stage=ingress} = %v, want at least the 3 shared reads", shared)
			}
		})
	}
}
