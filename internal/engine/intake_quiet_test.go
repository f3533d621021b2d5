package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// refusals counts the intake batches the database refused for a lane
// without a live drainer: each is a wasted round trip, and an ERROR line in
// the server's log.
type refusals struct {
	tripCounter
	n atomic.Int64
}

func (r *refusals) TraceBatchEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if errors.Is(data.Err, jobs.ErrNoLiveDrainer) {
		r.n.Add(1)
	}
}

// A quiet interface, one message every few drainer lingers, finds its lane's
// drainer gone each time. Its messages are stored in the transaction that
// activates a drainer, without first being refused by the one round trip
// that needs a live one; they arrive, in order.
func TestQuietInterfaceIsNotRefusedFirst(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	tracer := &refusals{}
	const linger = 100 * time.Millisecond
	listen, p := startTracedNode(t, db, tracer, linger)

	var want []string
	for i := range 5 {
		id := fmt.Sprintf("Q%d", i)
		want = append(want, id)
		send(t, listen, adt(id, "P1"))
		fixtures.Eventually(t, 10*time.Second, id+" delivered", func() bool { return slices.Contains(p.acceptedIDs(), id) })
		fixtures.Eventually(t, 10*time.Second, "the lanes' drainers done", func() bool { return liveDrainers(t, db) == 0 })
	}
	if got := firstDeliveries(p.acceptedIDs()); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if n := tracer.n.Load(); n != 0 {
		t.Errorf("%d of 5 messages to a lane without a drainer were refused first", n)
	}
}
