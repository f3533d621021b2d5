package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

// Sender sends one lane's messages in sequence, each only after the one
// before was acknowledged, trying each node's port in turn and resending a
// message until some node answers AA, as a real sending system does.
type Sender struct {
	Channel, Prefix string
	addrs           []string // one per node, in c.Nodes order
	nodeIDs         []string
	clients         []*mllp.Client

	mu    sync.Mutex
	acks  []Ack
	next  int
	noAA  int // attempts that got no AA
	start time.Time
}

// Ack is an AA a Sender got: for which message, from which node, when.
type Ack struct {
	ID   string
	Node string
	At   time.Time
}

// NewSender makes a Sender of channel's messages, their ids starting with
// prefix, to every node of c known so far.
func (c *Cluster) NewSender(channel, prefix string) *Sender {
	s := &Sender{Channel: channel, Prefix: prefix}
	for _, n := range c.Nodes {
		s.addrs = append(s.addrs, n.Ports[channel])
		s.nodeIDs = append(s.nodeIDs, n.ID)
		// The ACK timeout is short so a frozen or cut-off node costs the
		// sender two seconds, not thirty.
		s.clients = append(s.clients, &mllp.Client{Addr: n.Ports[channel], AckTimeout: 2 * time.Second, DialTimeout: 300 * time.Millisecond})
	}
	c.t.Cleanup(func() {
		for _, cl := range s.clients {
			cl.Close()
		}
	})
	return s
}

// Message is the ADT message a Sender sends with control id id.
func Message(id string) []byte {
	return []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|" + id + "|P|2.5\rPID|1||" + id + "\r")
}

// Run sends messages until ctx ends, pausing pace between messages. The
// message in hand when ctx ends is abandoned unacknowledged.
func (s *Sender) Run(ctx context.Context, pace time.Duration) {
	cur := 0
	for i := 0; ctx.Err() == nil; i++ {
		id := fmt.Sprintf("%s%05d", s.Prefix, i)
		for tries := 0; ctx.Err() == nil; tries++ {
			k := (cur + tries) % len(s.clients)
			if tries > 0 && tries%len(s.clients) == 0 {
				time.Sleep(20 * time.Millisecond) // nobody answered: the lease is moving
			}
			raw, err := s.clients[k].Send(ctx, Message(id))
			if err == nil {
				if a, perr := hl7.ParseACK(raw); perr == nil && a.Code == hl7.AckAccept {
					s.mu.Lock()
					s.acks = append(s.acks, Ack{ID: id, Node: s.nodeIDs[k], At: time.Now()})
					s.mu.Unlock()
					cur = k
					break
				}
			}
			s.mu.Lock()
			s.noAA++
			s.mu.Unlock()
		}
		if pace > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(pace):
			}
		}
	}
}

// Acked lists the AAs so far, in order.
func (s *Sender) Acked() []Ack {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acks)
}

// AckedIDs lists the ids of the messages acknowledged so far, in order.
func (s *Sender) AckedIDs() []string {
	var ids []string
	for _, a := range s.Acked() {
		ids = append(ids, a.ID)
	}
	return ids
}

// FirstAckAfter is the first AA from a node other than not, at or after t.
func (s *Sender) FirstAckAfter(t time.Time, not string) (Ack, bool) {
	for _, a := range s.Acked() {
		if !a.At.Before(t) && a.Node != not {
			return a, true
		}
	}
	return Ack{}, false
}

// Traffic runs one sender per lane until stop is called.
type Traffic struct {
	Senders []*Sender
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// StartTraffic starts one Sender per lane, to every node prepared so far,
// each sending a message every 10ms; they stop when the test ends.
func (c *Cluster) StartTraffic() *Traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &Traffic{cancel: cancel}
	for _, l := range Lanes {
		s := c.NewSender(l.Channel, l.Prefix)
		tr.Senders = append(tr.Senders, s)
		tr.wg.Add(1)
		go func() { defer tr.wg.Done(); s.Run(ctx, 10*time.Millisecond) }()
	}
	c.t.Cleanup(tr.Stop)
	return tr
}

// Stop stops every sender and waits for them.
func (tr *Traffic) Stop() { tr.cancel(); tr.wg.Wait() }

// WaitAcked waits until every lane has at least n more AAs than now.
func (c *Cluster) WaitAcked(tr *Traffic, n int, timeout time.Duration) {
	c.t.Helper()
	base := make([]int, len(tr.Senders))
	for i, s := range tr.Senders {
		base[i] = len(s.Acked())
	}
	deadline := time.Now().Add(timeout)
	for {
		done := true
		for i, s := range tr.Senders {
			done = done && len(s.Acked()) >= base[i]+n
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			var got []string
			for i, s := range tr.Senders {
				got = append(got, fmt.Sprintf("%s +%d", s.Channel, len(s.Acked())-base[i]))
			}
			c.t.Fatalf("timed out after %s waiting for %d more acknowledged messages per lane (got %v)\nsessions:\n%s\n%s",
				timeout, n, got, c.DBActivity(), c.DumpEdges())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DBActivity describes the test database's sessions: what each waits on and
// who blocks it (for a failed test).
func (c *Cluster) DBActivity() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.DB.Pool.Query(ctx, `
		SELECT pid, coalesce(state, ''), coalesce(wait_event_type || '/' || wait_event, ''),
			coalesce(extract(epoch FROM clock_timestamp() - xact_start)::float8, 0),
			pg_blocking_pids(pid)::text, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid int
		var state, wait, blockers, query string
		var xact float64
		if err := rows.Scan(&pid, &state, &wait, &xact, &blockers, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  pid %d %s wait=%s xact=%.1fs blocked_by=%s %q\n", pid, state, wait, xact, blockers, query)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, "  (reading sessions: %v)\n", err)
	}
	return b.String()
}

// FirstAckAfter is, over all lanes, the latest of each lane's first AA from
// a node other than not after t: when every lane was served again.
func (tr *Traffic) FirstAckAfter(t time.Time, not string) (time.Time, bool) {
	var last time.Time
	for _, s := range tr.Senders {
		a, ok := s.FirstAckAfter(t, not)
		if !ok {
			return time.Time{}, false
		}
		if a.At.After(last) {
			last = a.At
		}
	}
	return last, true
}

// CheckDelivered stops the traffic, waits until every acknowledged message
// reached the partner, and checks each lane's order: the deliveries, with
// repeats of an already delivered message removed, follow send order.
func (c *Cluster) CheckDelivered(tr *Traffic, timeout time.Duration) {
	c.t.Helper()
	tr.Stop()
	var acked []string
	for _, s := range tr.Senders {
		acked = append(acked, s.AckedIDs()...)
	}
	deadline := time.Now().Add(timeout)
	for {
		if _, ok := c.Partner.DeliveredAllBy(acked); ok {
			break
		}
		if time.Now().After(deadline) {
			got := map[string]bool{}
			for _, d := range c.Partner.Deliveries() {
				got[d.ID] = true
			}
			var missing []string
			for _, id := range acked {
				if !got[id] {
					missing = append(missing, id)
				}
			}
			c.t.Fatalf("after %s, %d of %d acknowledged messages were never delivered: %v", timeout, len(missing), len(acked), head(missing, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	all := c.Partner.Deliveries()
	dups := 0
	for _, s := range tr.Senders {
		var firsts []string
		seen := map[string]bool{}
		for _, d := range all {
			if !strings.HasPrefix(d.ID, s.Prefix) {
				continue
			}
			if seen[d.ID] {
				dups++
				continue
			}
			seen[d.ID] = true
			firsts = append(firsts, d.ID)
		}
		if !slices.IsSorted(firsts) { // ids are zero-padded in send order
			for i := 1; i < len(firsts); i++ {
				if firsts[i] < firsts[i-1] {
					c.t.Fatalf("lane %s delivered out of order: %s after %s (around %v)", s.Channel, firsts[i], firsts[i-1],
						firsts[max(0, i-5):min(len(firsts), i+5)])
				}
			}
		}
	}
	c.t.Logf("acknowledged %d messages on %d lanes; %d deliveries, %d of them repeats", len(acked), len(tr.Senders), len(all), dups)
}

// head is the first n of s, all of s when it is shorter.
func head(s []string, n int) []string { return s[:min(len(s), n)] }
