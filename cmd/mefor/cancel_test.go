package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
)

// slowPartner is an MLLP receiver that answers AA after delay, and records
// every message it receives.
type slowPartner struct {
	addr     string
	delay    time.Duration
	mu       sync.Mutex
	received []string
	arrived  chan string
}

func newSlowPartner(t *testing.T, delay time.Duration) *slowPartner {
	t.Helper()
	p := &slowPartner{delay: delay, arrived: make(chan string, 100)}
	p.addr = cluster.ServeMLLP(t, "127.0.0.1:0", func(ctx context.Context, m *hl7.Message) []byte {
		if !strings.HasPrefix(m.ControlID(), "CN") {
			// Another test's node pointed at a port this partner got
			// from the kernel later: not ours.
			return cluster.ACK(m, hl7.AckAccept, "")
		}
		p.mu.Lock()
		p.received = append(p.received, m.ControlID())
		p.mu.Unlock()
		p.arrived <- m.ControlID()
		select {
		case <-time.After(p.delay):
		case <-ctx.Done():
		}
		return cluster.ACK(m, hl7.AckAccept, "")
	})
	return p
}

func (p *slowPartner) receivedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.received)
}

// A partner takes 3 s to ACK; `mefor cancel` runs while a message is being
// sent. The message in flight reaches the partner, so it must end delivered
// with the partner's reply kept, and cancel must say so; the rows queued
// behind it are cancelled and never reach the partner.
func TestCancelDuringSendKeepsTheDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	p := newSlowPartner(t, 3*time.Second)
	listen := unusedAddr(t)
	path := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(path, []byte(reloadConfigYAML(listen, p.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	inProcessNode(t, db, "cancel-node", path)

	c := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second}
	defer c.Close()
	ids := []string{"CN000", "CN001", "CN002", "CN003", "CN004"}
	for _, id := range ids {
		if _, err := c.Send(ctx, cluster.Message(id)); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
	select {
	case id := <-p.arrived:
		if id != "CN000" {
			t.Fatalf("partner got %s first", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing reached the partner")
	}
	// Everything is queued for delivery behind the message in flight.
	pending := func() int {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_work WHERE stage = 'outbound' AND status = 'pending'`).Scan(&n)
		return n
	}
	cluster.Eventually(t, 20*time.Second, "all five queued for delivery", func() bool { return pending() == len(ids) })

	var out, errb bytes.Buffer
	code := run([]string{"cancel", "--destination", "down", "--database-url", db.URL}, &out, &errb)
	if code != 0 {
		t.Fatalf("cancel: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
	text := out.String()
	if !strings.Contains(text, "cancelled 4 ") || !strings.Contains(text, "1 was being sent and was delivered") {
		t.Fatalf("cancel said:\n%s\nwant 4 cancelled and the one in flight reported delivered", text)
	}

	// The message in flight: delivered, its reply kept, not cancelled.
	var status, ack string
	var replies, delivered, cancelled int
	err := db.Pool.QueryRow(ctx, `
		SELECT w.status,
			(SELECT count(*) FROM mefor_response r WHERE r.work_id = w.id AND r.body IS NOT NULL),
			coalesce((SELECT r.ack_code FROM mefor_response r WHERE r.work_id = w.id ORDER BY r.id DESC LIMIT 1), ''),
			(SELECT count(*) FROM mefor_event e WHERE e.work_id = w.id AND e.event = 'delivered'),
			(SELECT count(*) FROM mefor_event e WHERE e.work_id = w.id AND e.event = 'cancelled')
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
		WHERE m.control_id = 'CN000' AND w.stage = 'outbound'`).Scan(&status, &replies, &ack, &delivered, &cancelled)
	if err != nil {
		t.Fatal(err)
	}
	if status != "done" || replies != 1 || ack != "AA" || delivered != 1 || cancelled != 0 {
		t.Fatalf("in-flight row: status %s, %d replies (ack %q), %d delivered and %d cancelled events; want done, its AA reply, delivered only",
			status, replies, ack, delivered, cancelled)
	}
	// The queued ones: cancelled, and the partner never sees them.
	for _, id := range ids[1:] {
		var st string
		if err := db.Pool.QueryRow(ctx, `
			SELECT w.status FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id
			WHERE m.control_id = $1 AND w.stage = 'outbound'`, id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		if st != "cancelled" {
			t.Errorf("queued %s ended %s, want cancelled", id, st)
		}
	}
	time.Sleep(500 * time.Millisecond) // a wrongly kept row would be on its way by now
	if got := p.receivedIDs(); !slices.Equal(got, []string{"CN000"}) {
		t.Fatalf("partner received %v, want only the message that was in flight", got)
	}
	cluster.Eventually(t, 10*time.Second, "all five processed", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_message WHERE status = 'processed'`).Scan(&n)
		return n == len(ids)
	})
}
