package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
)

// PostgreSQL crashes mid-stream (a server process is SIGKILLed, so the
// postmaster resets shared memory and recovers from the WAL, losing what
// sat in its WAL buffers). The sender, a real interface, resends whatever
// got no ACK. Every ACKed message must still reach the partner, in order,
// and no more sends may repeat than the open record window plus the
// message stored whose ACK the crash cut off. A commit that returned
// before its WAL was flushed (synchronous_commit off, for intake as a
// mutant, or for every session on this server without
// dbpool.DurableCommits) loses ACKed messages here.
func TestDatabaseCrashLosesNoAcknowledgedMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testcontainers.NewServer(t)
	db, err := srv.CreateDB(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Pool.Close)
	// The suite's server commits without waiting for the flush, as a
	// careless production server might; the node's sessions must not
	// (dbpool.DurableCommits).

	// The partner holds one delivery until the crash is over, so that no
	// delivery record flushes the WAL meanwhile: only intake's commits do.
	hold := newGate(t)
	const window = 4
	_, p, listen := startDownstream(t, db, holdFirst(hold, "DC0020"), nil,
		"retry: {backoff: 100ms, max_backoff: 500ms}", fmt.Sprintf("record_batch: {rows: %d, window: 50ms}", window))

	// The crash lands while the sender streams: the messages ACKed just
	// before it are in the WAL buffers unless their commit flushed them.
	const total, crashAt = 300, 80
	var acked atomic.Int32
	crashed := make(chan error, 1)
	go func() {
		for acked.Load() < crashAt {
			time.Sleep(time.Millisecond)
		}
		crashed <- crashServer(db)
	}()
	var ids []string
	resends := 0
	for i := range total {
		id := fmt.Sprintf("DC%04d", i)
		ids = append(ids, id)
		for try := 0; ; try++ {
			ack, err := sendOne(listen, adt(id, "P"+strconv.Itoa(i)))
			if err == nil && ack.Code == hl7.AckAccept {
				break
			}
			if try > 600 {
				t.Fatalf("%s got no ACK in a minute after the crash (last: %v %v)", id, ack.Code, err)
			}
			resends++
			time.Sleep(100 * time.Millisecond)
		}
		acked.Add(1)
	}
	if err := <-crashed; err != nil {
		t.Fatal(err)
	}
	hold.let()
	if resends == 0 {
		t.Fatal("the crash refused no message: it did not happen while messages were in flight")
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		got := firstDeliveries(ours(p.acceptedIDs(), "DC"))
		if len(got) == total {
			if !slices.Equal(got, ids) {
				t.Fatalf("first deliveries out of order:\n got  %v\n want %v", got, ids)
			}
			break
		}
		if time.Now().After(deadline) {
			var missing []string
			for _, id := range ids {
				if !slices.Contains(got, id) {
					missing = append(missing, id)
				}
			}
			t.Fatalf("%d of %d ACKed messages delivered; missing %v", len(got), total, missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Sends repeat only for the open record window at the crash (the held
	// send), and for a message stored whose ACK the crash cut off (one
	// sender: at most one in flight, resent until ACKed).
	got := ours(p.acceptedIDs(), "DC")
	if dups := len(got) - total; dups > window+1 {
		t.Fatalf("%d sends repeated after one database crash, want at most %d: %v", dups, window+1, got)
	}
	t.Logf("one database crash: %d resends by the sender, %d repeated deliveries", resends, len(got)-total)
}

// crashServer SIGKILLs one of db's server processes: the postmaster then
// ends every session and recovers from the WAL, as after a crash, losing
// its WAL buffers. It returns once another session has seen the reset.
func crashServer(db *testcontainers.DB) error {
	ctx := context.Background()
	victim, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	// Referenced to the end: an unreachable connection's socket is closed
	// by its finalizer, and its server process would leave before the kill.
	defer victim.Close(ctx)
	witness, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	defer witness.Close(ctx)
	var pid int
	if err := victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	code, out, err := db.Server.Container().Exec(ctx, []string{"sh", "-c", "kill -KILL " + strconv.Itoa(pid)})
	if err != nil || code != 0 {
		var msg []byte
		if out != nil {
			msg, _ = io.ReadAll(out)
		}
		return fmt.Errorf("kill server process %d: exit %d, %v: %q", pid, code, err, msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := witness.Exec(ctx, `SELECT 1`); err != nil {
			return nil // the postmaster ended this session too: a crash reset
		}
		if time.Now().After(deadline) {
			return errors.New("the server did not reset after one of its processes was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
