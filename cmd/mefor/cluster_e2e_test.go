package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

// Failover of the listener lease between `mefor run` processes sharing one
// database and one config. MLLP traffic flows through every failover from
// senders that move to whichever node answers; at the end every message a
// node acknowledged has been delivered, each lane in send order. Each test
// prints MEASURED lines with the failover time it saw, for the timings in
// cluster_helpers_test.go (heartbeat 300ms, fence_timeout 1.2s, lease_ttl
// 2s, node_timeout 4s, reclaim every 500ms: loose enough that a renewal
// slowed by the rest of the suite does not fence a healthy holder).

// twoNodes starts node-a, waits until it holds the lease and serves, starts
// traffic, then starts node-b as a standby. Drainers created before node-b
// ran are node-a's, so a failure of node-a strands lanes.
func twoNodes(t *testing.T, c *cluster, aURL string) (a, b *clusterNode, tr *traffic) {
	t.Helper()
	a, b = c.node("node-a", aURL), c.node("node-b", "")
	c.run(a)
	c.waitHolder(a, 60*time.Second)
	tr = c.startTraffic()
	c.waitAcked(tr, 20, 30*time.Second)
	c.run(b)
	c.waitJoined(b, 60*time.Second)
	c.waitAcked(tr, 50, 30*time.Second)
	if edges := a.leaseEdgesAfter(time.Time{}, "listener lease fenced", "listener lease lost"); len(edges) > 0 {
		t.Fatalf("node-a gave the lease up before any fault was injected: %s (a fence here means a renewal took longer than fence_timeout: the machine is overloaded)\n%s",
			edges[0].Raw, c.dumpEdges())
	}
	if got := b.boundChannels(); got != 0 {
		t.Fatalf("standby node-b listens on %d channels while node-a holds the lease\n%s", got, c.dumpEdges())
	}
	if holder, _ := c.holderPerNodes(); holder != a.id {
		t.Fatalf("mefor nodes shows %q holding the lease, want %s", holder, a.id)
	}
	return a, b, tr
}

// Killing the holder: the standby takes the lease and answers MLLP within
// lease_ttl + one heartbeat, and the lanes the dead node was draining resume
// on the survivor within node_timeout + the reclaim interval, in order. In a
// fresh cluster the first node holds both the lease and River's leadership,
// so this kills River's leader too: the rescue must not wait for River to
// elect another (its leader TTL is about 15s).
func TestFailoverKillHolder(t *testing.T) {
	c := newCluster(t)
	a, b, tr := twoNodes(t, c, "")
	holder, riverLeader := c.holderPerNodes()
	if holder != a.id {
		t.Fatalf("mefor nodes shows %q holding the lease, want %s", holder, a.id)
	}
	drainers := c.runningDrainersOf(a.id)

	killAt := a.kill(t)
	c.eventually(30*time.Second, "every lane acknowledged by node-b after the kill", func() bool {
		_, ok := tr.firstAckAfter(killAt, a.id)
		return ok
	})
	served, _ := tr.firstAckAfter(killAt, a.id)
	bound, _ := b.boundAllAfter(killAt)
	failover := served.Sub(killAt)
	t.Logf("MEASURED kill failover: %v (SIGKILL holder -> the other node's AA on every lane; it listened after %v)",
		failover.Round(time.Millisecond), bound.Sub(killAt).Round(time.Millisecond))
	if limit := clLeaseTTL + clHeartbeat + clSlack; failover > limit {
		t.Errorf("node-b answered AA %v after the kill, want <= lease_ttl + heartbeat + %v slack = %v\n%s", failover, clSlack, limit, c.dumpEdges())
	}
	checkLanesResume(t, c, tr, killAt, fmt.Sprintf("killed node was holder, River's leader was %s, %d drainers ran on the killed node", riverLeader, drainers))

	c.checkDelivered(tr, 60*time.Second)
	c.assertNoOverlap()
	pollT(t, 10*time.Second, "mefor nodes showing node-b as holder and node-a stale", func() bool {
		var holds, stale bool
		for _, r := range c.nodesJSON() {
			holds = holds || (r.ID == b.id && r.HoldsLease)
			stale = stale || (r.ID == a.id && r.Status == "stale" && !r.HoldsLease)
		}
		return holds && stale
	})
}

// Dead-node lane rescue on its own: a node that drains some of the lanes but
// is not River's leader is killed; its lanes resume on the other node within
// node_timeout + the reclaim interval.
func TestKilledNodeLanesResume(t *testing.T) {
	c := newCluster(t)
	a, b := c.node("node-a", ""), c.node("node-b", "")
	c.run(a)
	c.waitHolder(a, 60*time.Second)
	c.run(b)
	c.waitJoined(b, 60*time.Second)
	// Both nodes fetch work from here on, so lanes start on either.
	tr := c.startTraffic()
	c.waitAcked(tr, 100, 30*time.Second)
	holder, leader := c.holderPerNodes()
	victim := b
	if leader == b.id {
		victim = a
	}
	drainers := c.runningDrainersOf(victim.id)
	if drainers == 0 {
		t.Skipf("no lane's drainer started on %s this time: killing it would rescue nothing", victim.id)
	}

	killAt := victim.kill(t)
	checkLanesResume(t, c, tr, killAt, fmt.Sprintf("killed %s had %d of the drainers; River's leader %s survived; lease holder was %s",
		victim.id, drainers, leader, holder))
	c.checkDelivered(tr, 60*time.Second)
	c.assertNoOverlap()
}

// checkLanesResume measures, for every lane, the time from the kill to the
// first delivery of a message acknowledged after it, and checks it against
// node_timeout + reclaim interval.
func checkLanesResume(t *testing.T, c *cluster, tr *traffic, killAt time.Time, what string) {
	t.Helper()
	rescue := measureLanesResume(t, c, tr, killAt, what)
	if limit := clNodeTimeout + clReclaim + clSlack; rescue > limit {
		t.Errorf("lanes resumed %v after the kill, want <= node_timeout + reclaim interval + %v slack = %v (%s)", rescue, clSlack, limit, what)
	}
}

// measureLanesResume waits until every lane delivers a message acknowledged
// after the kill, and returns how long after the kill that was.
func measureLanesResume(t *testing.T, c *cluster, tr *traffic, killAt time.Time, what string) time.Duration {
	t.Helper()
	var resumed time.Time
	for _, s := range tr.senders {
		var lane time.Time
		c.eventually(60*time.Second, "lane "+s.channel+" delivering messages acknowledged after the kill", func() bool {
			after := map[string]bool{}
			for _, a := range s.acked() {
				if a.at.After(killAt) {
					after[a.id] = true
				}
			}
			for _, d := range c.partner.deliveries() {
				if after[d.id] {
					lane = d.at
					return true
				}
			}
			return false
		})
		if lane.After(resumed) {
			resumed = lane
		}
	}
	rescue := resumed.Sub(killAt)
	t.Logf("MEASURED kill lane rescue: %v (SIGKILL -> every lane delivering messages acknowledged after it; %s)", rescue.Round(time.Millisecond), what)
	return rescue
}

// Freezing the holder past fence_timeout: the standby takes over, and the
// frozen node, once resumed, has demoted itself: it acknowledges nothing and
// stores nothing while node-b holds the lease.
func TestFailoverFrozenHolder(t *testing.T) {
	c := newCluster(t)
	a, b, tr := twoNodes(t, c, "")

	stopAt := time.Now()
	a.signal(t, syscall.SIGSTOP)
	cont := func() { _ = a.p.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(cont) // never leave a stopped process behind

	// The kernel still accepts connections for a stopped process: this
	// message waits in node-a's socket until it resumes.
	time.Sleep(100 * time.Millisecond)
	probe1, err := sendRawProbe(a.ports["adt"], "PROBE1")
	if err != nil {
		t.Fatalf("connect to frozen node-a: %v", err)
	}
	c.eventually(30*time.Second, "node-b listening on every channel", func() bool {
		_, ok := b.boundAllAfter(stopAt)
		return ok
	})
	bound, _ := b.boundAllAfter(stopAt)
	flowing := true
	if cutOffSessionsBlockLanes {
		// Known gap: a lane node-a froze holding locked accepts nothing
		// until node-a resumes.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, flowing = tr.firstAckAfter(stopAt, a.id); flowing {
				break
			}
		}
		if !flowing {
			t.Logf("note: some lane got no AA from node-b while node-a was frozen (not asserted: see cutOffSessionsBlockLanes)")
		}
	} else {
		c.eventually(30*time.Second, "every lane acknowledged by node-b", func() bool {
			_, ok := tr.firstAckAfter(stopAt, a.id)
			return ok
		})
	}
	served, _ := tr.firstAckAfter(stopAt, a.id)
	// Stay frozen well past fence_timeout and lease_ttl, with traffic flowing
	// through node-b meanwhile.
	if rest := time.Until(stopAt.Add(3 * clFenceTimeout)); rest > 0 {
		time.Sleep(rest)
	}
	if flowing {
		c.waitAcked(tr, 20, 30*time.Second)
	}
	probe2, err := sendRawProbe(a.ports["lab"], "PROBE2")
	if err != nil {
		t.Fatalf("connect to frozen node-a: %v", err)
	}

	contAt := time.Now()
	cont()
	frozen := contAt.Sub(stopAt)
	for _, p := range []*rawProbe{probe1, probe2} {
		if code, how := p.answer(3 * time.Second); code == string(hl7.AckAccept) {
			t.Errorf("resumed node-a acknowledged %s (sent to it while frozen) AA while node-b holds the lease\n%s", p.id, c.dumpEdges())
		} else {
			t.Logf("%s sent to frozen node-a: %s %s", p.id, how, code)
		}
	}
	// Right after resuming, node-a's ports accept nothing that gets an AA.
	for i, deadline := 0, time.Now().Add(2*time.Second); time.Now().Before(deadline); i++ {
		for _, l := range clLanes {
			cl := &mllp.Client{Addr: a.ports[l.channel], AckTimeout: 500 * time.Millisecond, DialTimeout: 300 * time.Millisecond}
			raw, err := cl.Send(context.Background(), clMessage("PROBE3"))
			cl.Close()
			if err == nil {
				if ack, perr := hl7.ParseACK(raw); perr == nil && ack.Code == hl7.AckAccept {
					t.Fatalf("resumed node-a answered AA on %s %v after SIGCONT while node-b holds the lease\n%s", l.channel, time.Since(contAt), c.dumpEdges())
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}

	c.eventually(10*time.Second, "node-a logging that it lost or fenced the lease", func() bool {
		return len(a.leaseEdgesAfter(stopAt, "listener lease fenced", "listener lease lost")) > 0
	})
	c.eventually(10*time.Second, "node-a unbinding its listeners", func() bool {
		_, ok := a.unboundAllAfter(stopAt)
		return ok
	})
	demoted := a.leaseEdgesAfter(stopAt, "listener lease fenced", "listener lease lost")[0]
	unbound, _ := a.unboundAllAfter(stopAt)
	firstAA := "not on every lane while frozen"
	if flowing {
		firstAA = served.Sub(stopAt).Round(time.Millisecond).String()
	}
	t.Logf("MEASURED freeze takeover: %v (SIGSTOP -> node-b listening on every channel; first AA via node-b on every lane after %s; frozen %v)",
		bound.Sub(stopAt).Round(time.Millisecond), firstAA, frozen.Round(time.Millisecond))
	t.Logf("MEASURED freeze resume: node-a logged %q %v and stopped listening %v after SIGCONT",
		demoted.Msg, demoted.Time.Sub(contAt).Round(time.Millisecond), unbound.Sub(contAt).Round(time.Millisecond))
	if again := a.leaseEdgesAfter(stopAt, "listener lease acquired", "listener lease renewed after gap"); len(again) > 0 {
		t.Errorf("node-a took the lease again after its freeze while node-b held it: %s\n%s", again[0].Raw, c.dumpEdges())
	}

	for _, id := range []string{"PROBE1", "PROBE2", "PROBE3"} {
		if at := c.storedAt(id); len(at) > 0 {
			t.Errorf("%s, sent only to node-a, was stored at %v although node-b held the lease", id, at)
		}
	}
	// Nothing node-a received while frozen was stored after it resumed: every
	// row stored since SIGCONT is one node-b acknowledged after storing it.
	c.waitAcked(tr, 30, 30*time.Second)
	tr.stop()
	acks := map[string][]ack{}
	lastAcked := map[byte]string{} // per lane prefix
	for _, s := range tr.senders {
		for _, a := range s.acked() {
			acks[a.id] = append(acks[a.id], a)
			lastAcked[a.id[0]] = a.id
		}
	}
	rows, err := c.db.Pool.Query(context.Background(), `SELECT control_id, received_at FROM mefor_message WHERE received_at >= $1`, contAt)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil { // every message here parses, so control_id is set
			t.Fatal(err)
		}
		if id == "" {
			continue
		}
		if last, lane := lastAcked[id[0]]; lane && id > last {
			continue // in flight when the traffic stopped: stored, never acknowledged
		}
		ok := false
		for _, k := range acks[id] {
			ok = ok || (k.node == b.id && !k.at.Before(at))
		}
		if !ok {
			t.Errorf("message %s stored %v after node-a resumed, but node-b never acknowledged it after that: node-a stored it", id, at.Sub(contAt))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()

	c.checkDelivered(tr, 60*time.Second)
	if holder, _ := c.holderPerNodes(); holder != b.id {
		t.Errorf("mefor nodes shows %q holding the lease after the freeze, want %s", holder, b.id)
	}
}

// Cutting the holder off from the database: it fences itself and unbinds
// before its lease expires, so its listeners and the new holder's never
// overlap; the new holder serves every lane although the cut-off node left a
// lane lock taken; healed, the old holder stays a standby.
func TestFailoverPartitionedHolder(t *testing.T) {
	c := newCluster(t)
	proxy := newDBProxy(t, dbHostPort(t, c.db.URL))
	a, b, tr := twoNodes(t, c, proxy.url(t, c.db.URL))

	// Cut at the worst moment: node-a has taken a lane lock in a
	// transaction it cannot commit now. PostgreSQL keeps that session and
	// its lock, and node-b must take over all the same.
	cutAt, inLock := proxy.CutHoldingLaneLock(10 * time.Second)
	if !inLock {
		t.Logf("note: no session of node-a was seen holding a lane lock within 10s; cut anyway")
	}
	c.eventually(30*time.Second, "node-b listening on every channel", func() bool {
		_, ok := b.boundAllAfter(cutAt)
		return ok
	})
	c.eventually(15*time.Second, "node-a fencing itself and unbinding", func() bool {
		_, ok := a.unboundAllAfter(cutAt)
		return ok && len(a.leaseEdgesAfter(cutAt, "listener lease fenced")) > 0
	})
	fenced := a.leaseEdgesAfter(cutAt, "listener lease fenced")[0].Time
	unbound, _ := a.unboundAllAfter(cutAt)
	bound, _ := b.boundAllAfter(cutAt)
	acquired, ok := b.firstAfter(cutAt, "listener lease acquired", "")
	if !ok {
		t.Fatalf("node-b listens but logged no lease acquisition\n%s", c.dumpEdges())
	}
	t.Logf("MEASURED partition: node-a fenced at +%v, stopped listening at +%v; node-b acquired at +%v, listening at +%v (after the cut)",
		fenced.Sub(cutAt).Round(time.Millisecond), unbound.Sub(cutAt).Round(time.Millisecond),
		acquired.Sub(cutAt).Round(time.Millisecond), bound.Sub(cutAt).Round(time.Millisecond))
	// node-b can only acquire once the lease expired by the database clock.
	if !unbound.Before(acquired) {
		t.Errorf("node-a stopped listening %v after node-b acquired the lease; it must fence before its lease expires\n%s",
			unbound.Sub(acquired), c.dumpEdges())
	}
	if !unbound.Before(bound) {
		t.Errorf("node-a and node-b listened at the same time for %v\n%s", unbound.Sub(bound), c.dumpEdges())
	}
	c.assertNoOverlap()

	if cutOffSessionsBlockLanes && inLock {
		// Known gap: lanes node-a left locked accept nothing until it is
		// healed; show what moved instead of requiring every lane to.
		base := make([]int, len(tr.senders))
		for i, s := range tr.senders {
			base[i] = len(s.acked())
		}
		time.Sleep(time.Until(cutAt.Add(5 * time.Second)))
		for i, s := range tr.senders {
			t.Logf("note: lane %s: %d acknowledged during the rest of the cut (not asserted: see cutOffSessionsBlockLanes)", s.channel, len(s.acked())-base[i])
		}
	} else {
		c.waitAcked(tr, 30, 30*time.Second)
	}
	if rest := time.Until(cutAt.Add(3 * time.Second)); rest > 0 {
		time.Sleep(rest)
	}
	healAt := time.Now()
	proxy.Heal()
	pollT(t, 15*time.Second, "healed node-a active again in mefor nodes", func() bool {
		for _, r := range c.nodesJSON() {
			if r.ID == a.id {
				return r.Status == "active" && r.LastSeen.After(healAt)
			}
		}
		return false
	})
	c.waitAcked(tr, 30, 30*time.Second)
	// Healed, node-a stays a standby: it may hold the lease again only after
	// node-b gave it up.
	c.assertRetakenOnlyAfterGiveUp(a, b, cutAt)
	c.assertHolderAgrees()
	c.checkDelivered(tr, 60*time.Second)
	c.assertNoOverlap()
}

// A planned failover with `mefor stepdown`: asked of a standby it is refused
// and changes nothing; asked of the holder, the holder releases, the standby
// takes over, and the old holder does not take the lease back.
func TestStepdownMovesListeners(t *testing.T) {
	c := newCluster(t)
	a, b, tr := twoNodes(t, c, "")

	askedAt := time.Now()
	r, code, out := c.stepdown("--node", b.id)
	if code != 3 || r.Outcome != "not-holder" || r.WasHolder || r.Holder != a.id {
		t.Fatalf("stepdown --node %s (a standby): exit %d, %+v; want exit 3, outcome not-holder naming %s as holder\n%s", b.id, code, r, a.id, out)
	}
	time.Sleep(5 * clHeartbeat)
	for _, n := range []*clusterNode{a, b} {
		if edges := n.leaseEdgesAfter(askedAt, "listener lease released"); len(edges) > 0 {
			t.Fatalf("a refused stepdown released the lease: %s\n%s", edges[0].Raw, c.dumpEdges())
		}
		if edges := n.leaseEdgesAfter(askedAt); len(edges) > 0 {
			t.Fatalf("the lease moved after a refused stepdown: %s (a fence here means a renewal took longer than fence_timeout: the machine is overloaded)\n%s",
				edges[0].Raw, c.dumpEdges())
		}
	}
	if a.boundChannels() != len(clLanes) || b.boundChannels() != 0 {
		t.Fatalf("a refused stepdown changed who listens\n%s", c.dumpEdges())
	}

	sdAt := time.Now()
	r, code, out = c.stepdown("--wait", "--timeout", "30s")
	took := time.Since(sdAt)
	if code != 0 || r.Outcome != "released" || r.Node != a.id || !r.WasHolder || r.ReleasedAt == nil || r.NewHolder != b.id {
		t.Fatalf("stepdown --wait: exit %d, %+v; want exit 0, outcome released by %s, new holder %s\n%s\n%s", code, r, a.id, b.id, out, c.dumpEdges())
	}
	c.eventually(10*time.Second, "node-b listening on every channel", func() bool {
		_, ok := b.boundAllAfter(sdAt)
		return ok
	})
	c.eventually(10*time.Second, "every lane acknowledged by node-b", func() bool {
		_, ok := tr.firstAckAfter(sdAt, a.id)
		return ok
	})
	released, ok := a.firstAfter(sdAt, "listener lease released", "")
	if !ok {
		t.Errorf("node-a did not log the release\n%s", c.dumpEdges())
	}
	unbound, _ := a.unboundAllAfter(sdAt)
	bound, _ := b.boundAllAfter(sdAt)
	served, _ := tr.firstAckAfter(sdAt, a.id)
	t.Logf("MEASURED stepdown: command returned after %v; node-a released at +%v, stopped listening at +%v; node-b listening at +%v, first AA on every lane at +%v",
		took.Round(time.Millisecond), released.Sub(sdAt).Round(time.Millisecond), unbound.Sub(sdAt).Round(time.Millisecond),
		bound.Sub(sdAt).Round(time.Millisecond), served.Sub(sdAt).Round(time.Millisecond))
	if unbound.IsZero() || !unbound.Before(bound) {
		t.Errorf("node-a stopped listening at %v, not before node-b started at %v\n%s", unbound, bound, c.dumpEdges())
	}

	// Well past the claim pause (two heartbeats), node-a stays a standby.
	c.waitAcked(tr, 30, 30*time.Second)
	if rest := time.Until(sdAt.Add(10 * clHeartbeat)); rest > 0 {
		time.Sleep(rest)
	}
	c.assertRetakenOnlyAfterGiveUp(a, b, sdAt)
	c.assertHolderAgrees()

	// The claim pause, seen alone: with node-a frozen nobody else can take
	// the lease, and node-b, having released it, still waits two heartbeats
	// before it claims it again.
	a.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = a.p.cmd.Process.Signal(syscall.SIGCONT) })
	sd2 := time.Now()
	r, code, out = c.stepdown()
	if code != 0 || r.Outcome != "released" || r.Node != b.id {
		_ = a.p.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatalf("stepdown with node-a frozen: exit %d, %+v; want exit 0, released by %s\n%s", code, r, b.id, out)
	}
	c.eventually(10*time.Second, "node-b, alone, claiming the lease again", func() bool {
		_, ok := b.firstAfter(sd2, "listener lease acquired", "")
		return ok
	})
	a.signal(t, syscall.SIGCONT)
	rel, _ := b.firstAfter(sd2, "listener lease released", "")
	back, _ := b.firstAfter(sd2, "listener lease acquired", "")
	pause := back.Sub(rel)
	t.Logf("MEASURED claim pause: node-b claimed the lease it released again after %v, with no other node able to (pause: 2 heartbeats = %v)",
		pause.Round(time.Millisecond), 2*clHeartbeat)
	if rel.IsZero() || pause < 2*clHeartbeat-10*time.Millisecond {
		t.Errorf("node-b claimed the lease again %v after releasing it, within its claim pause of two heartbeats (%v)\n%s", pause, 2*clHeartbeat, c.dumpEdges())
	}
	c.waitAcked(tr, 30, 30*time.Second)
	c.checkDelivered(tr, 60*time.Second)
	c.assertNoOverlap()

	// Each request is audited by the CLI, each answer by the node that gave it.
	recs, err := audit.List(context.Background(), c.db.Pool, audit.Filter{Action: audit.ActionStepdown})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := len(recs) - 1; i >= 0; i-- {
		got = append(got, recs[i].Node+":"+recs[i].Outcome)
	}
	slices.Sort(got)
	want := []string{":requested", ":requested", ":requested", a.id + ":released", b.id + ":not-holder", b.id + ":released"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("stepdown audit rows (node:outcome) = %v, want %v", got, want)
	}
}

// cutOffSessionsBlockLanes was the switch for a gap now closed: a node cut
// off from the database (or frozen) in the middle of a transaction left its
// session, with the lane lock it took, alive in PostgreSQL until TCP
// keepalive gave up (hours), so the new holder's intake for that channel
// waited on the lock. `mefor run` now sets idle_in_transaction_session_timeout
// to lease_ttl on its sessions; with this false the tests require every
// lane to move during the cut or freeze.
const cutOffSessionsBlockLanes = false

// dbHostPort is the host:port of a database URL.
func dbHostPort(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		t.Fatalf("database URL without a port: %v", err)
	}
	return u.Host
}
