package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// laneReads counts the drainers' reads of their lanes (pipeline.PendingRows).
type laneReads struct {
	tripCounter
	n atomic.Int64
}

func (r *laneReads) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if strings.Contains(data.SQL, "FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id") {
		r.n.Add(1)
	}
}

// A lightly loaded interface, one message at a time with its drainers
// lingering in between, costs each stage about one read of its lane per
// message: the read that finds the message. A drainer that has served all
// that a read found waits to be woken instead of reading again at once,
// which before found the lane empty every time and doubled the reads.
func TestLightLaneReadOncePerMessage(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	tracer := &laneReads{}
	// The drainers stay through the whole run.
	listen, p := startTracedNode(t, db, tracer, 3*time.Second)

	const n = 10
	var want []string
	for i := range n {
		id := fmt.Sprintf("L%d", i)
		want = append(want, id)
		send(t, listen, adt(id, "P1"))
		fixtures.Eventually(t, 10*time.Second, id+" delivered", func() bool { return slices.Contains(p.acceptedIDs(), id) })
	}
	if got := firstDeliveries(p.acceptedIDs()); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	// Three stages, one read each per message, and a little slack for a
	// wake that lands while a stage is between its read and its hand-off.
	reads := tracer.n.Load()
	t.Logf("%d lane reads for %d messages", reads, n)
	if reads > 3*n+6 {
		t.Errorf("%d lane reads for %d messages through 3 stages, want at most %d", reads, n, 3*n+6)
	}
}
