package cluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The cluster's timings: its config's heartbeat, fence_timeout, lease_ttl
// and node_timeout, and each node's --reclaim-interval. They are fast, so a
// failover takes about two seconds. Slack absorbs process scheduling on a
// busy 2-core machine; tests add it to the bounds they check.
const (
	Heartbeat    = 300 * time.Millisecond
	FenceTimeout = 1200 * time.Millisecond
	LeaseTTL     = 2 * time.Second
	NodeTimeout  = 4 * time.Second
	Reclaim      = 500 * time.Millisecond
	Slack        = time.Second
)

// Lane is one channel of the cluster's config: its messages' control ids
// start with Prefix, and Env names the variable that carries a node's port
// for it.
type Lane struct{ Channel, Prefix, Env string }

// Lanes are the lanes under test: one channel per lane prefix, each routed
// to its own destination, so the ingress, routed and outbound lanes of each
// are separate and their order is checked separately.
var Lanes = []Lane{
	{"adt", "A", "ADT_PORT"},
	{"lab", "L", "LAB_PORT"},
}

// Cluster is several `mefor run` processes on one test database and one
// config, delivering to one Partner. Its methods fail the test that made it.
type Cluster struct {
	t       *testing.T
	Dir     string
	DB      *testcontainers.DB
	Config  string
	Partner *Partner
	Nodes   []*Node
}

// Node is one `mefor run` process of a Cluster, prepared by Cluster.Node
// and started by Cluster.Run.
type Node struct {
	ID    string
	Ports map[string]string // channel -> 127.0.0.1:port
	DBURL string
	Proc  *Proc
	// KilledAt is set once the node has been SIGKILLed.
	KilledAt time.Time
	// Args are added to the node's `mefor run` arguments.
	Args []string
}

// New writes the cluster's config into a temporary directory, with every
// lane's destination at a new Partner, and migrates a new test database.
// No node runs yet.
func New(t *testing.T) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Dir: t.TempDir(), DB: testcontainers.NewDB(t), Partner: NewPartner(t)}
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: {heartbeat: %s, fence_timeout: %s, lease_ttl: %s, node_timeout: %s}\n",
		Heartbeat, FenceTimeout, LeaseTTL, NodeTimeout)
	b.WriteString("channels:\n")
	for _, l := range Lanes {
		fmt.Fprintf(&b, "  %s:\n    inbound: {mllp: {listen: \"127.0.0.1:${%s}\"}}\n    routes: [{name: out, destinations: [%s_out]}]\n",
			l.Channel, l.Env, l.Channel)
	}
	b.WriteString("destinations:\n")
	for _, l := range Lanes {
		fmt.Fprintf(&b, "  %s_out:\n    type: mllp\n    mllp: {address: %q}\n    retry: {max_attempts: 0, backoff: 100ms, max_backoff: 1s}\n",
			l.Channel, c.Partner.Addr)
	}
	c.Config = filepath.Join(c.Dir, "mefor.yaml")
	if err := os.WriteFile(c.Config, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := RunMefor(t, c.Dir, c.Env(c.DB.URL), "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	return c
}

// Env is the environment a mefor process of the cluster needs to reach the
// database at dbURL.
func (c *Cluster) Env(dbURL string) []string { return []string{"DATABASE_URL=" + dbURL} }

// Node prepares a node with its own listener ports, not started yet, so
// senders can know every node's ports up front; dbURL overrides the database
// address (to route it through a proxy).
func (c *Cluster) Node(id, dbURL string) *Node {
	c.t.Helper()
	if dbURL == "" {
		dbURL = c.DB.URL
	}
	n := &Node{ID: id, Ports: map[string]string{}, DBURL: dbURL}
	c.Nodes = append(c.Nodes, n)
	for _, l := range Lanes {
		n.Ports[l.Channel] = c.uniquePort()
	}
	return n
}

// uniquePort is a free port no other node of the cluster was given:
// fixtures.FreeAddr closes its probe, so two calls can return the same port, and a
// node then binds the port another node just unbound.
func (c *Cluster) uniquePort() string {
	c.t.Helper()
	for {
		addr := fixtures.FreeAddr(c.t)
		used := false
		for _, n := range c.Nodes {
			for _, a := range n.Ports {
				used = used || a == addr
			}
		}
		if !used {
			return addr
		}
	}
}

// Run starts the node's `mefor run` process.
func (c *Cluster) Run(n *Node) {
	c.t.Helper()
	env := c.Env(n.DBURL)
	for _, l := range Lanes {
		_, port, _ := net.SplitHostPort(n.Ports[l.Channel])
		env = append(env, l.Env+"="+port)
	}
	args := append([]string{"--log-format", "json", "run", "--config", c.Config, "--node-id", n.ID,
		"--admin-listen=", "--reclaim-interval", Reclaim.String()}, n.Args...)
	n.Proc = StartProc(c.t, c.Dir, env, args...)
}

// WaitHolder waits until n has acquired the lease and bound every listener.
func (c *Cluster) WaitHolder(n *Node, timeout time.Duration) {
	c.t.Helper()
	Eventually(c.t, timeout, n.ID+" holding the lease and listening on every channel", func() bool {
		return n.BoundChannels() == len(Lanes)
	})
	for _, addr := range n.Ports {
		WaitListening(c.t, addr)
	}
}

// WaitJoined waits until the node has registered and runs (as a standby).
func (c *Cluster) WaitJoined(n *Node, timeout time.Duration) {
	c.t.Helper()
	Eventually(c.t, timeout, n.ID+" running", func() bool { return len(n.Logs("node running")) > 0 })
}

// Poll is Eventually at a slower pace, for conditions that run a CLI
// process each time: a process every 50ms would load the machine the nodes
// under test run on.
func Poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	fixtures.Poll(t, timeout, 300*time.Millisecond, what, cond)
}

// Eventually is the package's Eventually that, on timeout, shows the
// database sessions and the nodes' lease edges.
func (c *Cluster) Eventually(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	if !fixtures.Within(timeout, 50*time.Millisecond, cond) {
		c.t.Fatalf("timed out after %s waiting for %s\nsessions:\n%s\n%s", timeout, what, c.DBActivity(), c.DumpEdges())
	}
}
