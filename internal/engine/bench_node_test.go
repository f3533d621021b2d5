package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The benchmark runs the node as a real `mefor run` subprocess, so the
// memory and CPU it reports are the node's alone: senders, the partner and
// River's no-op client live in the benchmark process.

// buildMefor builds cmd/mefor into dir once per benchmark run.
func buildMefor(b *testing.B, dir string) string {
	b.Helper()
	bin := filepath.Join(dir, "mefor")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/mefor/mefor/cmd/mefor").CombinedOutput()
	if err != nil {
		b.Fatalf("build mefor: %v\n%s", err, out)
	}
	return bin
}

// nodeProc is one `mefor run` subprocess.
type nodeProc struct {
	cmd     *exec.Cmd
	pid     int
	admin   string
	logPath string
	done    chan error
}

const benchNodeID = "bench"

// startNodeProc writes yaml to a config file, starts `mefor run` on db and
// returns once its admin /healthz answers 200 and every listen address
// accepts a connection. extraEnv adds KEY=VALUE pairs (encryption keys).
func startNodeProc(b *testing.B, bin string, db *testcontainers.DB, yaml string, listens []string, extraEnv ...string) *nodeProc {
	b.Helper()
	dir := b.TempDir()
	cfgPath := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	adminAddr := fixtures.FreeAddr(b)
	logPath := filepath.Join(dir, "node.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--log-level", "warn", "run", "--config", cfgPath,
		"--node-id", benchNodeID, "--admin-listen", adminAddr)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatalf("start mefor run: %v", err)
	}
	logFile.Close()
	p := &nodeProc{cmd: cmd, pid: cmd.Process.Pid, admin: adminAddr, logPath: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	b.Cleanup(func() { p.stop(b) })

	deadline := time.Now().Add(60 * time.Second)
	ready := func() bool {
		resp, err := http.Get("http://" + adminAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	for !ready() {
		p.waitOrFail(b, deadline, "its admin /healthz to answer 200")
	}
	for _, addr := range listens {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
				break
			}
			p.waitOrFail(b, deadline, "its listener "+addr+" to accept")
		}
	}
	return p
}

// waitOrFail pauses briefly, failing the benchmark if the node exited or
// the deadline passed.
func (p *nodeProc) waitOrFail(b *testing.B, deadline time.Time, what string) {
	b.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		b.Fatalf("mefor run exited (%v) before %s; log:\n%s", err, what, p.logTail())
	case <-time.After(50 * time.Millisecond):
	}
	if time.Now().After(deadline) {
		b.Fatalf("timed out waiting for %s; log:\n%s", what, p.logTail())
	}
}

// stop sends SIGTERM and waits for the node to exit (its database sessions
// end with it, which flushes their statistics), killing it past a bound.
func (p *nodeProc) stop(b *testing.B) {
	select {
	case err := <-p.done:
		p.done <- err
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(45 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		b.Logf("mefor run did not stop within 45s of SIGTERM; killed")
	}
}

func (p *nodeProc) logTail() string {
	data, _ := os.ReadFile(p.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// procStats reads the node's peak and current resident memory (MB) and its
// CPU time so far (user+system) from /proc.
type procStats struct {
	hwmMB, rssMB float64
	cpu          time.Duration
}

func (p *nodeProc) stats(b *testing.B) procStats {
	b.Helper()
	var s procStats
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		b.Fatalf("read node status: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmHWM:":
			s.hwmMB = kb / 1024
		case "VmRSS:":
			s.rssMB = kb / 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		b.Fatalf("read node stat: %v", err)
	}
	// Fields after the parenthesised command name (which may hold spaces):
	// utime and stime are the 14th and 15th fields of the line.
	rest := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	// USER_HZ is 100 on every Linux the project runs on.
	s.cpu = time.Duration(utime+stime) * 10 * time.Millisecond
	return s
}

// xactCommits is pg_stat_database's xact_commit for one database, or for
// the whole server when name is "".
func xactCommits(b *testing.B, db *testcontainers.DB, name string) int64 {
	b.Helper()
	var n int64
	err := db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database WHERE $1 = '' OR datname = $1`, name).Scan(&n)
	if err != nil {
		b.Fatalf("read xact_commit: %v", err)
	}
	return n
}

// waitSessionsGone waits until only the benchmark's own pool is connected
// to db, so the stopped node's sessions have ended and flushed their
// transaction counts into pg_stat_database.
func waitSessionsGone(b *testing.B, db *testcontainers.DB) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int32
		if err := db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db.Name).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n <= db.Pool.Stat().TotalConns() || time.Now().After(deadline) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runCLI runs one mefor command against db and returns its wall time.
func runCLI(b *testing.B, bin string, db *testcontainers.DB, args ...string) time.Duration {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		b.Fatalf("mefor %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return d
}

// intakeSplit reads the node's own intake histograms from its /metrics,
// which cover the whole scenario (the node received nothing else), and
// says where the ACK time went on the node's side: node_ack_p99_ms (frame
// in to ACK written), commit_wait_p99_ms (a message waiting for its commit
// to start), commit_p99_ms (one commit, statements to durable) and
// commit_msgs_mean (messages per commit), and gathers (how often a woken
// drainer waited Limits.Gather for more rows, all stages). Quantiles are interpolated in
// the histogram's buckets, as Prometheus's histogram_quantile does, so
// they are as coarse as the buckets; the sender's own ack_p99_ms is exact.
func (p *nodeProc) intakeSplit(b *testing.B) []string {
	b.Helper()
	fams := fixtures.Scrape(b, p.admin)
	// merged sums a family's histograms over their labels (the channels).
	merged := func(name string) (count uint64, sum float64, bounds []float64, cum []uint64) {
		f, ok := fams[name]
		if !ok {
			b.Fatalf("node /metrics has no %s", name)
		}
		for i, m := range f.GetMetric() {
			h := m.GetHistogram()
			count += h.GetSampleCount()
			sum += h.GetSampleSum()
			for j, bk := range h.GetBucket() {
				if i == 0 {
					bounds = append(bounds, bk.GetUpperBound())
					cum = append(cum, 0)
				}
				cum[j] += bk.GetCumulativeCount()
			}
		}
		return count, sum, bounds, cum
	}
	p99ms := func(name string) float64 {
		count, _, bounds, cum := merged(name)
		rank := 0.99 * float64(count)
		lower, below := 0.0, uint64(0)
		for i, c := range cum {
			if float64(c) >= rank {
				in := float64(c - below)
				return 1000 * (lower + (bounds[i]-lower)*(rank-float64(below))/in)
			}
			lower, below = bounds[i], c
		}
		return 1000 * lower // above the last bound: its lower edge
	}
	// gathers counts the drainers' waits for company (workers' gather), all
	// stages; a family nothing incremented is absent from the exposition.
	gathers := 0.0
	if f, ok := fams["mefor_drainer_gathers_total"]; ok {
		for _, m := range f.GetMetric() {
			gathers += m.GetCounter().GetValue()
		}
	}
	n, total, _, _ := merged("mefor_intake_commit_messages")
	mean := 0.0
	if n > 0 {
		mean = total / float64(n)
	}
	return []string{
		fmt.Sprintf("node_ack_p99_ms=%.2f", p99ms("mefor_ack_duration_seconds")),
		fmt.Sprintf("commit_wait_p99_ms=%.2f", p99ms("mefor_intake_commit_wait_seconds")),
		fmt.Sprintf("commit_p99_ms=%.2f", p99ms("mefor_intake_commit_seconds")),
		fmt.Sprintf("commit_msgs_mean=%.2f", mean),
		fmt.Sprintf("gathers=%.0f", gathers),
	}
}
