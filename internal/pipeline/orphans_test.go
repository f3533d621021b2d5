package pipeline_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
)

// A destination removed with more deliveries queued than one chunk holds
// has every one of them dead-lettered, head first, over several
// transactions, and each message ends in error; a kept destination's rows
// are left alone.
func TestOrphansDeadLetteredInChunks(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	const gone, kept = 2500, 30
	for _, s := range []string{
		`INSERT INTO mefor_message (channel, source, size, status)
			SELECT 'adt', 'test', 10, 'routed' FROM generate_series(1, 2530)`,
		`INSERT INTO mefor_work (message_id, stage, lane, channel, destination)
			SELECT id, 'outbound', 'outbound:' || d, channel, d
			FROM (SELECT id, channel, CASE WHEN id <= 2500 THEN 'gone' ELSE 'lab' END AS d FROM mefor_message ORDER BY id) m`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	k := pipeline.Known{Channels: []string{"adt"}, Routes: []string{"adt/all"}, Handlers: []string{"passthrough"}, Destinations: []string{"lab"}}
	n, err := pipeline.DeadLetterOrphansInChunks(ctx, db.Pool, k, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if n != gone {
		t.Errorf("dead-lettered %d rows, want %d", n, gone)
	}
	var dead, errored, pendingKept, wrongReason int
	if err := db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE w.destination = 'gone' AND w.status = 'dead'),
			count(*) FILTER (WHERE w.destination = 'gone' AND m.status = 'error'),
			count(*) FILTER (WHERE w.destination = 'lab' AND w.status = 'pending' AND m.status = 'routed'),
			count(*) FILTER (WHERE w.destination = 'gone' AND w.last_error IS DISTINCT FROM 'destination ''gone'' is not in the config')
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id`).Scan(&dead, &errored, &pendingKept, &wrongReason); err != nil {
		t.Fatal(err)
	}
	if dead != gone || errored != gone || wrongReason != 0 {
		t.Errorf("removed destination: %d rows dead and %d messages in error, %d with another reason; want %d, %d, 0",
			dead, errored, wrongReason, gone, gone)
	}
	if pendingKept != kept {
		t.Errorf("kept destination: %d rows still pending, want %d", pendingKept, kept)
	}
}
