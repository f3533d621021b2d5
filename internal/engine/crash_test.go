package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/workers"
)

// A rescue (the lane's drainer died, maybe mid-send) counts one attempt
// against the lane's head, once. A backlog served over several executions
// after it must not have each execution's first row charged again, or one
// node death would eat the retry budget of many messages.
func TestRescueCountsOneCrashOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := freeAddr(t)
	partnerAddr := downAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`
  downstream:
    type: mllp
    mllp: {address: "%s", connect_timeout: 200ms}
    retry: {backoff: 100ms, max_backoff: 100ms}
`, partnerAddr))
	limits := workers.DefaultLimits
	limits.Batch, limits.MaxRows = 1, 2 // each execution serves two rows, then yields
	a, err := engine.New(engine.Options{Config: cfg, Pool: db.Pool, Logger: testLogger(t), NodeID: "a", Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var msgs [][]byte
	for i := range 6 {
		ids = append(ids, fmt.Sprintf("RC%03d", i))
		msgs = append(msgs, adt(ids[i], "P1"))
	}
	send(t, listen, msgs...) // the partner is down: all six queue
	eventually(t, 20*time.Second, "all queued, the head failing", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`) == 6 &&
			queryInt(t, db, `SELECT coalesce(max(attempts), 0) FROM mefor_work WHERE stage = 'outbound'`) >= 1
	})
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Leave the lane as a rescue of a drainer that died mid-send does: the
	// job available again with the rescue recorded (River's rescuer and
	// reclaim both append an error entry and bump river:rescue_count), the
	// rows due.
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_work SET next_attempt_at = now() - interval '1 second' WHERE status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		UPDATE river_job SET state = 'available', scheduled_at = now(),
			errors = array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', 'rescued', 'trace', '')),
			metadata = metadata || jsonb_build_object('river:rescue_count', coalesce((metadata->>'river:rescue_count')::int, 0) + 1)
		WHERE kind = 'mefor_outbound'`); err != nil {
		t.Fatal(err)
	}

	p := newCtlPartner(t, partnerAddr, nil)
	startNode(t, db, cfg, func(o *engine.Options) { o.NodeID = "b"; o.Limits = limits })
	deadline := time.Now().Add(60 * time.Second)
	for len(ours(p.acceptedIDs(), "RC")) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("partner accepted only %v; rows: %v", ours(p.acceptedIDs(), "RC"),
				queryStrings(t, db, `SELECT format('%s %s %s', lane, status, attempts) FROM mefor_work WHERE stage = 'outbound' ORDER BY seq`))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := ours(p.acceptedIDs(), "RC"); !slices.Equal(got, ids) {
		t.Fatalf("partner accepted %v, want %v", got, ids)
	}
	crashed := queryStrings(t, db, `SELECT m.control_id FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
		WHERE r.outcome = 'crashed' ORDER BY r.id`)
	if !slices.Equal(crashed, []string{"RC000"}) {
		t.Fatalf("crashed attempts recorded for %v; want one, for the head the dead drainer may have been sending", crashed)
	}
}
