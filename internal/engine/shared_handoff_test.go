package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/store"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
)

// Route hand-offs of several lanes that arrive while another is in flight
// share its successor's transaction; without sharing each takes its own. A
// hand-off stuck on a lock holds the others at most their patience: then
// they commit alone.
//
// Channel c0's route hand-off is held in flight by a transaction of the
// test's that holds c0's routed lane; meanwhile c1 to c3 each get a
// message, whose route hand-offs come while it is in flight.
func TestHandoffsArrivingTogetherShareATransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts func(*engine.Options)
		// routed is how many transactions route S1 to S3; -1: they must
		// be delivered while S0's hand-off is still held.
		routed int
	}{
		{"shared", func(o *engine.Options) { o.HandoffPatience = time.Minute }, 1},
		{"alone", func(o *engine.Options) { o.HandoffsAlone = true }, -1},
		{"patience", func(o *engine.Options) { o.HandoffPatience = 200 * time.Millisecond }, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testcontainers.NewDB(t)
			p := newPartner(t, "")
			var y strings.Builder
			listens := make([]string, 4)
			y.WriteString("cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}\nchannels:\n")
			for i := range listens {
				listens[i] = freeAddr(t)
				fmt.Fprintf(&y, "  c%d:\n    inbound: {mllp: {listen: %q}}\n    routes:\n      - {name: out, destinations: [d%d]}\n", i, listens[i], i)
			}
			y.WriteString("destinations:\n")
			for i := range listens {
				fmt.Fprintf(&y, "  d%d: {type: mllp, mllp: {address: %q}}\n", i, p.addr)
			}
			cfg, err := config.Parse("test.yaml", []byte(y.String()), nil)
			if err != nil {
				t.Fatal(err)
			}
			n := startNode(t, db, cfg, func(o *engine.Options) {
				o.Limits.Linger = time.Minute // every drainer lingers through the test
				tc.opts(o)
			})
			// Start every lane's drainers.
			for i, l := range listens {
				send(t, l, adt(fmt.Sprintf("W%d", i), "P1"))
			}
			eventually(t, 30*time.Second, "W0 to W3 delivered", func() bool { return len(p.acceptedIDs()) == 4 })

			hold, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Rollback(ctx)
			if err := jobs.LockLanes(ctx, hold, []string{jobs.RoutedLane("c0")}); err != nil {
				t.Fatal(err)
			}
			send(t, listens[0], adt("S0", "P1"))
			eventually(t, 30*time.Second, "S0's route hand-off waiting for its lane", func() bool {
				return queryInt(t, db, `SELECT count(*)::int FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%'`) > 0
			})
			for i := 1; i < 4; i++ {
				send(t, listens[i], adt(fmt.Sprintf("S%d", i), "P1"))
			}
			delivered := func() bool {
				got := p.acceptedIDs()
				return slices.Contains(got, "S1") && slices.Contains(got, "S2") && slices.Contains(got, "S3")
			}
			if tc.routed < 0 {
				eventually(t, 30*time.Second, "S1 to S3 delivered while S0's hand-off is held", delivered)
				if slices.Contains(p.acceptedIDs(), "S0") {
					t.Fatal("S0 delivered while its routed lane was held")
				}
			} else {
				eventually(t, 30*time.Second, "S1 to S3's hand-offs waiting for S0's", func() bool { return engine.WaitingHandoffs(n) == 3 })
			}
			hold.Rollback(ctx)
			eventually(t, 30*time.Second, "S0 to S3 delivered", func() bool { return delivered() && slices.Contains(p.acceptedIDs(), "S0") })

			// Events are inserted by the hand-off that records them and
			// never updated, so their xmin is that hand-off's transaction.
			xacts := queryInt(t, db, `SELECT count(DISTINCT e.xmin::text)::int FROM mefor_event e
				JOIN mefor_message m ON m.id = e.message_id WHERE e.event = $1 AND m.control_id IN ('S1', 'S2', 'S3')`, store.EventRouted)
			switch {
			case tc.routed > 0 && xacts != tc.routed:
				t.Errorf("S1 to S3 were routed in %d transactions, want %d", xacts, tc.routed)
			case tc.routed < 0 && xacts != 3:
				t.Errorf("S1 to S3 were routed in %d transactions while S0's was held, want 3", xacts)
			}
			shared := value(gatherMetrics(t, n), "mefor_handoffs_shared_total", "stage", "ingress")
			if tc.routed > 0 && shared < 3 {
				t.Errorf("mefor_handoffs_shared_total{stage=ingress} = %v, want at least the 3 shared", shared)
			}
			if tc.name == "alone" && shared > 0 {
				t.Errorf("mefor_handoffs_shared_total{stage=ingress} = %v with sharing off", shared)
			}
			// The partner has them; their records follow its ACKs.
			eventually(t, 30*time.Second, "S0 to S3 processed", func() bool {
				return countStatus(t, db, store.StatusProcessed) == 8
			})
		})
	}
}
