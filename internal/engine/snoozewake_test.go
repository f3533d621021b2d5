package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A drainer that yields its lane, or snoozes until a retry is due, is
// served again without waiting for River's poll: the node announces the
// snooze once River has recorded it. Here the poll is an hour and every
// drainer yields after each row (MaxRows 1), at every stage; R1's first
// delivery is answered AE and retried 200 ms later. Announced, everything
// arrives, in order, R1 twice; unannounced, the lanes stop at their first
// yield.
func TestSnoozedDrainersAreAnnounced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wake bool
	}{{"announced", true}, {"unannounced", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testcontainers.NewDB(t)
			_, p, listen := startDownstream(t, db, failFirst("R1", 1, hl7.AckError), func(o *engine.Options) {
				o.StageQueuePoll = time.Hour
				o.Limits.MaxRows = 1
				o.Limits.Linger = time.Minute // no drainer completes: each goes on only by its snooze
				o.NoSnoozeWake = !tc.wake
			}, "retry: {backoff: 200ms, max_backoff: 200ms}")
			want := []string{"M1", "M2", "R1", "M3"}
			for _, id := range want {
				send(t, listen, adt(id, "P1"))
			}
			if !tc.wake {
				time.Sleep(3 * time.Second)
				if got := p.acceptedIDs(); len(got) == len(want) {
					t.Fatalf("unannounced, with River's poll an hour, the lanes went on past their yields: %v", got)
				}
				return
			}
			fixtures.Eventually(t, 30*time.Second, "all four delivered", func() bool { return len(p.acceptedIDs()) == len(want) })
			if got := fmt.Sprint(p.acceptedIDs()); got != fmt.Sprint(want) {
				t.Errorf("accepted %s, want %v", got, want)
			}
			if got, want := fmt.Sprint(p.receivedIDs()), "[M1 M2 R1 R1 M3]"; got != want {
				t.Errorf("received %s, want %s (R1 retried once)", got, want)
			}
		})
	}
}
