package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
)

// Signal sends sig to the node's process, SIGSTOP to freeze it and
// SIGCONT to thaw it.
func (n *Node) Signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := n.Proc.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, n.ID, err)
	}
}

// Kill SIGKILLs the node's process, waits for it to exit and returns when
// it was killed.
func (n *Node) Kill(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	n.Proc.Stop(t, syscall.SIGKILL)
	n.KilledAt = at
	return at
}

// RawProbe writes one framed message on a fresh connection to addr without
// waiting for the answer; Answer reads it later.
type RawProbe struct {
	ID   string
	conn net.Conn
}

// SendRawProbe sends Message(id), framed, on a new connection to addr.
func SendRawProbe(addr, id string) (*RawProbe, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	frame := append([]byte{0x0b}, Message(id)...)
	frame = append(frame, 0x1c, 0x0d)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(frame); err != nil {
		c.Close()
		return nil, err
	}
	return &RawProbe{ID: id, conn: c}, nil
}

// Answer reads whatever the node sends back within d: the ACK code, or ""
// when the connection closed or nothing came.
func (p *RawProbe) Answer(d time.Duration) (code string, how string) {
	defer p.conn.Close()
	_ = p.conn.SetReadDeadline(time.Now().Add(d))
	buf, err := io.ReadAll(io.LimitReader(p.conn, 1<<16))
	if len(buf) > 0 {
		body := strings.Trim(string(buf), "\x0b\x1c\x0d")
		if a, perr := hl7.ParseACK([]byte(body)); perr == nil {
			return string(a.Code), "answered"
		}
		return "", "answered with something that is not an ACK"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "", "no answer"
	}
	return "", "connection closed"
}

// StoredAt lists the received_at of every stored copy of a control id.
func (c *Cluster) StoredAt(id string) []time.Time {
	c.t.Helper()
	rows, err := c.DB.Pool.Query(context.Background(), `SELECT received_at FROM mefor_message WHERE control_id = $1 ORDER BY id`, id)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			c.t.Fatal(err)
		}
		out = append(out, at)
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// RunningDrainersOf counts River jobs running on node id right now.
func (c *Cluster) RunningDrainersOf(id string) int {
	var n int
	err := c.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by[array_length(attempted_by, 1)] = $1 AND kind IN ('mefor_ingress', 'mefor_routed', 'mefor_outbound')`, id).Scan(&n)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// DumpEdges shows every node's lease and listener lines (for a failed test).
func (c *Cluster) DumpEdges() string {
	var b strings.Builder
	var all []LogLine
	for _, n := range c.Nodes {
		all = append(all, n.Logs("listener lease acquired", "listener lease renewed after gap", "listener lease lost",
			"listener lease fenced", "listener lease released", "listening", "stopped listening")...)
	}
	slices.SortFunc(all, func(a, b LogLine) int { return a.Time.Compare(b.Time) })
	for _, l := range all {
		fmt.Fprintf(&b, "%s %s %s %s\n", l.Time.Format(time.StampMicro), l.Node, l.Msg, l.Channel)
	}
	return b.String()
}
