package cluster

import (
	"bufio"
	"encoding/json"
	"slices"
	"strings"
	"time"
)

type LogLine struct {
	Time    time.Time
	Msg     string
	Node    string
	Channel string
	Addr    string
	Raw     string
}

// Logs returns the node's JSON log lines, only those with one of msgs when
// any are given.
func (n *Node) Logs(msgs ...string) []LogLine {
	if n.Proc == nil {
		return nil
	}
	var out []LogLine
	sc := bufio.NewScanner(strings.NewReader(n.Proc.Out.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l struct {
			Time    time.Time `json:"time"`
			Msg     string    `json:"msg"`
			Node    string    `json:"node"`
			Channel string    `json:"channel"`
			Addr    string    `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		if len(msgs) > 0 && !slices.Contains(msgs, l.Msg) {
			continue
		}
		out = append(out, LogLine{Time: l.Time, Msg: l.Msg, Node: l.Node, Channel: l.Channel, Addr: l.Addr, Raw: line})
	}
	return out
}

// BoundChannels is how many channels the node listens on now, per its log.
func (n *Node) BoundChannels() int {
	bound := map[string]bool{}
	for _, l := range n.Logs("listening", "stopped listening") {
		bound[l.Channel] = l.Msg == "listening"
	}
	k := 0
	for _, b := range bound {
		if b {
			k++
		}
	}
	return k
}

// LeaseEdgesAfter lists the node's lease-edge log lines at or after t.
func (n *Node) LeaseEdgesAfter(t time.Time, msgs ...string) []LogLine {
	if len(msgs) == 0 {
		msgs = []string{"listener lease acquired", "listener lease renewed after gap", "listener lease lost",
			"listener lease fenced", "listener lease released"}
	}
	var out []LogLine
	for _, l := range n.Logs(msgs...) {
		if !l.Time.Before(t) {
			out = append(out, l)
		}
	}
	return out
}

// Interval is a span during which a node had a channel's listener bound.
type Interval struct {
	Node, Channel string
	From, To      time.Time // to is zero while still bound
}

// BindIntervals reads the node's bind/unbind log lines. A killed node's
// open intervals end at the kill.
func (n *Node) BindIntervals() []Interval {
	var out []Interval
	open := map[string]int{}
	for _, l := range n.Logs("listening", "stopped listening") {
		l.Channel = "channel " + l.Channel
		if l.Msg == "listening" {
			open[l.Channel] = len(out)
			out = append(out, Interval{Node: n.ID, Channel: l.Channel, From: l.Time})
			continue
		}
		if i, ok := open[l.Channel]; ok {
			out[i].To = l.Time
			delete(open, l.Channel)
		}
	}
	for _, i := range open {
		out[i].To = n.KilledAt // zero (open) unless killed
	}
	return out
}

// FirstAfter is the time of the first of n's log lines with msg at or after
// t, for channel ch when ch is not empty.
func (n *Node) FirstAfter(t time.Time, msg, ch string) (time.Time, bool) {
	for _, l := range n.Logs(msg) {
		if !l.Time.Before(t) && (ch == "" || l.Channel == ch) {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// BoundAllAfter is when n had bound every channel after t (the latest of
// its first "listening" lines for each channel), and whether it had.
func (n *Node) BoundAllAfter(t time.Time) (time.Time, bool) { return n.allAfter(t, "listening") }

// UnboundAllAfter is when n had unbound every channel after t.
func (n *Node) UnboundAllAfter(t time.Time) (time.Time, bool) {
	return n.allAfter(t, "stopped listening")
}

// allAfter is the latest, over the lanes' channels, of n's first log line
// with msg at or after t, and whether every channel has one.
func (n *Node) allAfter(t time.Time, msg string) (time.Time, bool) {
	var last time.Time
	for _, l := range Lanes {
		at, ok := n.FirstAfter(t, msg, l.Channel)
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// LeaseIntervals reads the node's lease edges: from "acquired" (or
// "renewed after gap") to "lost", "fenced" or "released". A killed node's
// open interval ends at the kill.
func (n *Node) LeaseIntervals() []Interval {
	var out []Interval
	open := -1
	for _, l := range n.LeaseEdgesAfter(time.Time{}) {
		switch l.Msg {
		case "listener lease acquired", "listener lease renewed after gap":
			if open < 0 {
				open = len(out)
				out = append(out, Interval{Node: n.ID, Channel: "(lease)", From: l.Time})
			}
		default:
			if open >= 0 {
				out[open].To = l.Time
				open = -1
			}
		}
	}
	if open >= 0 {
		out[open].To = n.KilledAt
	}
	return out
}

// AssertNoOverlap fails when two nodes had the same channel bound, or both
// held the lease, at the same time, according to their own logs (one host
// clock for all). Not for a frozen node: it cannot log while frozen.
func (c *Cluster) AssertNoOverlap() {
	c.t.Helper()
	var all []Interval
	for _, n := range c.Nodes {
		all = append(all, n.BindIntervals()...)
		all = append(all, n.LeaseIntervals()...)
	}
	end := func(i Interval) time.Time {
		if i.To.IsZero() {
			return time.Now().Add(time.Hour)
		}
		return i.To
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.Node == b.Node || a.Channel != b.Channel {
				continue
			}
			if a.From.Before(end(b)) && b.From.Before(end(a)) {
				c.t.Errorf("%s on two nodes at once: %s %s..%s and %s %s..%s", a.Channel,
					a.Node, a.From.Format(time.StampMicro), fmtEnd(a.To), b.Node, b.From.Format(time.StampMicro), fmtEnd(b.To))
			}
		}
	}
}

// AssertRetakenOnlyAfterGiveUp fails when old took the lease again after
// since while cur still held it. On a slow machine cur may fence itself
// (its renewals late) and old take over legitimately; that is logged.
func (c *Cluster) AssertRetakenOnlyAfterGiveUp(old, cur *Node, since time.Time) {
	c.t.Helper()
	again := old.LeaseEdgesAfter(since, "listener lease acquired", "listener lease renewed after gap")
	if len(again) == 0 {
		return
	}
	gaveUp := cur.LeaseEdgesAfter(since, "listener lease lost", "listener lease fenced", "listener lease released")
	if len(gaveUp) == 0 || !gaveUp[0].Time.Before(again[0].Time) {
		c.t.Errorf("%s took the lease again (%s) while %s held it\n%s", old.ID, again[0].Raw, cur.ID, c.DumpEdges())
		return
	}
	c.t.Logf("note: %s took the lease again %v after %s logged %q (its renewals were late on this machine)",
		old.ID, again[0].Time.Sub(gaveUp[0].Time).Round(time.Millisecond), cur.ID, gaveUp[0].Msg)
}

// LogHolder is the node whose own log says it holds the lease now.
func (c *Cluster) LogHolder() string {
	for _, n := range c.Nodes {
		for _, i := range n.LeaseIntervals() {
			if i.To.IsZero() {
				return n.ID
			}
		}
	}
	return ""
}

// AssertHolderAgrees checks that `mefor nodes` shows as lease holder the
// node whose log says it holds the lease, and that only it listens.
func (c *Cluster) AssertHolderAgrees() {
	c.t.Helper()
	var want, got string
	deadline := time.Now().Add(5 * time.Second)
	for {
		want = c.LogHolder()
		got, _ = c.HolderPerNodes()
		if got == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond) // an edge may be between the log and the database
	}
	if got != want {
		c.t.Errorf("mefor nodes shows %q holding the lease, the nodes' logs say %q\n%s", got, want, c.DumpEdges())
	}
	for _, n := range c.Nodes {
		if n.KilledAt.IsZero() && n.ID != want && n.BoundChannels() != 0 {
			c.t.Errorf("%s listens on %d channels while %q holds the lease\n%s", n.ID, n.BoundChannels(), want, c.DumpEdges())
		}
	}
}

func fmtEnd(t time.Time) string {
	if t.IsZero() {
		return "(still bound)"
	}
	return t.Format(time.StampMicro)
}
