package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A message whose send crashes the node (here the partner kills the node
// process whenever it receives it) counts one attempt per crash: with
// max_attempts 3 it is dead-lettered after its third crash, without being
// sent a fourth time, and the lane moves on to the messages behind it. The
// crashes are counted once each: the next message's ordinary retry (an AE,
// then accepted) is not charged with them again.
func TestPoisonMessageCountsItsCrashes(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	env := []string{"DATABASE_URL=" + db.URL}
	listen := fixtures.FreeAddr(t)

	var mu sync.Mutex
	var received []string
	ready := make(chan struct{}) // the messages are all stored
	crash := make(chan struct{}, 10)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	partner := &mllp.Server{Handler: mllp.HandlerFunc(func(ctx context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		m, err := hl7.Parse(raw)
		if err != nil {
			return nil
		}
		id := m.ControlID()
		if id != "POISON" && id != "AFTER1" && id != "AFTER2" {
			// Another test's node pointed at a port this partner got from
			// the kernel later: not ours.
			return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
		}
		mu.Lock()
		first := !slices.Contains(received, id)
		received = append(received, id)
		mu.Unlock()
		switch {
		case id == "POISON":
			<-ready
			crash <- struct{}{} // the node dies with this send in flight
			<-ctx.Done()
			return nil
		case id == "AFTER1" && first:
			return hl7.NewACK(m, hl7.AckError, "try again", hl7.NewControlID(), time.Now())
		}
		return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	})}
	go func() { _ = partner.Serve(ln) }()
	t.Cleanup(func() { _ = partner.Shutdown(context.Background()) })

	cfg := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
cluster: {heartbeat: 300ms, fence_timeout: 1200ms, lease_ttl: 2s, node_timeout: 4s}
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [{name: out, destinations: [downstream]}]
destinations:
  downstream:
    type: mllp
    mllp: {address: %q, ack_timeout: 1m}
    retry: {max_attempts: 3, backoff: 100ms, max_backoff: 100ms}
`, listen, ln.Addr().String())), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cluster.RunMefor(t, dir, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	start := func() *cluster.Proc {
		return cluster.StartProc(t, dir, env, "run", "--config", cfg, "--reclaim-interval", "1s", "--admin-listen=")
	}
	node := start()
	cluster.WaitListening(t, listen)
	client := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second}
	defer client.Close()
	for _, id := range []string{"POISON", "AFTER1", "AFTER2"} {
		raw, err := client.Send(context.Background(), cluster.Message(id))
		if err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
		if ack, err := hl7.ParseACK(raw); err != nil || ack.Code != hl7.AckAccept {
			t.Fatalf("send %s: %v %v", id, ack.Code, err)
		}
	}
	close(ready)

	delivered := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(received, "AFTER2")
	}
	crashes := 0
	deadline := time.After(2 * time.Minute)
	for !delivered() {
		select {
		case <-crash:
			crashes++
			node.Stop(t, syscall.SIGKILL)
			if crashes > 6 {
				t.Fatalf("the poison message crashed the node %d times; with max_attempts 3 it must be dead after 3", crashes)
			}
			node = start()
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("after %d crashes the lane has not moved on", crashes)
		}
	}
	mu.Lock()
	got := slices.Clone(received)
	mu.Unlock()
	if want := []string{"POISON", "POISON", "POISON", "AFTER1", "AFTER1", "AFTER2"}; !slices.Equal(got, want) {
		t.Fatalf("partner received %v, want %v: three crashes, then the lane moves on", got, want)
	}
	// The partner has AFTER2 before its send's record window is recorded
	// (with AFTER1's delivery, in the same transaction): wait for that.
	cluster.Eventually(t, 30*time.Second, "the last deliveries recorded", func() bool {
		var n int
		err := db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM mefor_message WHERE control_id IN ('AFTER1', 'AFTER2') AND status = 'processed'`).Scan(&n)
		return err == nil && n == 2
	})
	var status string
	var attempts int
	if err := db.Pool.QueryRow(context.Background(), `
		SELECT w.status, w.attempts FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE m.control_id = 'POISON' AND w.stage = 'outbound'`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || attempts != 3 {
		t.Fatalf("poison row: %s after %d attempts, want dead after 3", status, attempts)
	}
	var outcomes []string
	rows, err := db.Pool.Query(context.Background(), `
		SELECT r.outcome FROM mefor_response r JOIN mefor_message m ON m.id = r.message_id
		WHERE m.control_id = 'AFTER1' ORDER BY r.attempt`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, o)
	}
	if want := []string{"AE", "delivered"}; !slices.Equal(outcomes, want) {
		t.Fatalf("the message after the poison one has attempts %v, want %v: no crash counted against it", outcomes, want)
	}
}
