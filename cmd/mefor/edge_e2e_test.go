package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// raiseFileLimit makes sure this process, and the node it starts (which
// inherits the limit), may open need files. It skips the test only when
// the hard limit is too low for that.
func raiseFileLimit(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= need {
		return
	}
	if lim.Max < need {
		t.Skipf("needs %d open files, and the hard limit (ulimit -Hn) is %d; raise it to run this test", need, lim.Max)
	}
	lim.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("raising the open files limit to %d: %v", need, err)
	}
}

// metricValue reads one sample of GET /metrics from the admin listener, -1
// when it is absent.
func metricValue(t *testing.T, admin, name string, labels map[string]string) float64 {
	t.Helper()
	fams := fixtures.Scrape(t, admin)
	f, ok := fams[name]
	if !ok {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		return sampleValue(m)
	}
	return -1
}

func sampleValue(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// vmRSS is the resident memory of process pid, in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// holdIdle opens n connections from the loopback address from to addr
// and keeps them open, idle, until the test ends. The node may close any
// of them; they are still held on this side.
func holdIdle(t *testing.T, from, addr string, n int) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
	for i := range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d from %s: %v", i+1, n, from, err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// 2,000 idle connections from one address cannot crowd out another
// sender. On a listener with the default caps, 16 of them are held and
// the other 1,984 are closed at once and counted; on a listener whose
// caps let all 2,000 in, the node holds them all. Either way a sender
// from another address is ACKed AA within the client's usual timeout,
// and the node stays under 200 MB resident.
func TestIdleFloodFromOneAddress(t *testing.T) {
	t.Parallel()
	const flood = 2000
	raiseFileLimit(t, 2*flood+2048)
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	capped, wide, admin := fixtures.FreeAddr(t), fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	cfg := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`channels:
  capped:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [archive]}]
  wide:
    inbound: {mllp: {listen: %q, max_connections: 2500, max_connections_per_ip: 2500}}
    routes: [{destinations: [archive]}]
destinations:
  archive: {type: file, file: {directory: out}}
`, capped, wide)), 0o600); err != nil {
		t.Fatal(err)
	}
	node := cluster.StartProc(t, dir, []string{"DATABASE_URL=" + db.URL},
		"run", "--migrate", "--config", cfg, "--node-id", "flood", "--admin-listen", admin)
	cluster.WaitListening(t, capped)
	cluster.WaitListening(t, wide)
	metric := func(name string, labels ...string) float64 {
		m := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			m[labels[i]] = labels[i+1]
		}
		return metricValue(t, admin, name, m)
	}
	// The probes above are closed; wait for the node to see it, so the
	// counts below are the flood's alone.
	cluster.Eventually(t, 30*time.Second, "the listeners idle", func() bool {
		return metric("mefor_connections_open", "channel", "capped") == 0 && metric("mefor_connections_open", "channel", "wide") == 0
	})
	baseRSS := vmRSS(t, node.Cmd.Process.Pid)

	holdIdle(t, "127.0.0.2", capped, flood)
	holdIdle(t, "127.0.0.2", wide, flood)
	cluster.Eventually(t, 60*time.Second, "the node to take in the flood", func() bool {
		return metric("mefor_connections_refused_total", "channel", "capped", "reason", "max_connections_per_ip") == flood-16 &&
			metric("mefor_connections_open", "channel", "wide") == flood
	})
	if got := metric("mefor_connections_open", "channel", "capped"); got != 16 {
		t.Errorf("the capped listener holds %v connections, want max_connections_per_ip's 16", got)
	}
	if got := metric("mefor_connections_refused_total", "channel", "wide", "reason", "max_connections_per_ip"); got != -1 {
		t.Errorf("the wide listener refused %v connections, want none", got)
	}

	for _, ch := range []struct{ name, addr string }{{"capped", capped}, {"wide", wide}} {
		c := &mllp.Client{Addr: ch.addr} // the client's default timeouts
		raw, err := c.Send(context.Background(), phiMessage("FLOOD-"+ch.name, "P1", "DOE^JANE"))
		c.Close()
		if err != nil {
			t.Fatalf("%s: a sender from 127.0.0.1 during the flood: %v", ch.name, err)
		}
		if ack, err := hl7.ParseACK(raw); err != nil || ack.Code != hl7.AckAccept {
			t.Fatalf("%s: ack %v %v, want AA", ch.name, ack.Code, err)
		}
	}

	rss := vmRSS(t, node.Cmd.Process.Pid)
	t.Logf("node resident memory: %d MiB before the flood, %d MiB holding %d idle connections", baseRSS>>20, rss>>20, flood+16)
	if rss >= 200<<20 {
		t.Errorf("node resident memory %d MiB with the flood held, want under 200 MiB", rss>>20)
	}
}
