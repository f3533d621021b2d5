package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// These tests run the real mefor binary as separate processes, the way an
// operator does, against a PostgreSQL from the harness.

// quickstartConfig writes the quickstart config with its ports replaced by
// free ones, so tests can run side by side.
func quickstartConfig(t *testing.T, dir, listen, downstream string) string {
	t.Helper()
	src, err := os.ReadFile("../../examples/quickstart/mefor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(string(src), "127.0.0.1:2575", listen)
	cfg = strings.ReplaceAll(cfg, "127.0.0.1:2576", downstream)
	if cfg == string(src) {
		t.Fatal("quickstart config no longer uses ports 2575/2576; update this test")
	}
	path := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// controlIDsInDir lists the control ids of the files a sink wrote, in the
// order it received them (its file names start with a sequence number).
func controlIDsInDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	var ids []string
	for _, e := range entries { // ReadDir sorts by name: the sink's sequence
		if strings.HasPrefix(e.Name(), ".") {
			continue // being written
		}
		body, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m, err := hl7.Parse(body)
		if err != nil {
			t.Fatalf("sink file %s: %v", e.Name(), err)
		}
		ids = append(ids, m.ControlID())
	}
	return ids
}

// sentIDs parses `mefor send` output into the control ids it sent with AA.
func sentIDs(t *testing.T, out string) []string {
	t.Helper()
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) == 3 {
			if f[2] != "AA" {
				t.Fatalf("message %s got %s, want AA", f[1], f[2])
			}
			ids = append(ids, f[1])
		}
	}
	return ids
}

// The quickstart as the README tells it: sink, run, send. Every message is
// ACKed AA with its control id, reaches the sink in order and the archive,
// and ends processed. With the sink stopped, messages queue; once it is back
// they arrive, in order, none lost.
func TestQuickstartEndToEnd(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	env := []string{"DATABASE_URL=" + db.URL}
	listen, downstream := fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	cfg := quickstartConfig(t, dir, listen, downstream)
	msgs, err := filepath.Abs("../../examples/quickstart/adt.hl7")
	if err != nil {
		t.Fatal(err)
	}

	sink := cluster.StartProc(t, dir, env, "sink", "--listen", downstream, "--dir", "sink1", "--quiet")
	adminAddr := fixtures.FreeAddr(t)
	node := cluster.StartProc(t, dir, env, "run", "--migrate", "--config", cfg, "--node-id", "qs", "--admin-listen", adminAddr)
	cluster.WaitListening(t, downstream)
	cluster.WaitListening(t, listen)
	checkAdmin(t, adminAddr, "qs")

	out, err := cluster.RunMefor(t, dir, env, "send", "--to", listen, msgs)
	if err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	first := sentIDs(t, out)
	if len(first) != 5 {
		t.Fatalf("send reported %d messages, want the 5 of adt.hl7:\n%s", len(first), out)
	}
	cluster.Eventually(t, 30*time.Second, "5 messages at the sink", func() bool { return len(controlIDsInDir(t, filepath.Join(dir, "sink1"))) == 5 })
	if got := controlIDsInDir(t, filepath.Join(dir, "sink1")); !slices.Equal(got, first) {
		t.Fatalf("sink received %v, want %v", got, first)
	}
	// The archive is its own lane, independent of downstream's.
	cluster.Eventually(t, 30*time.Second, "the 5 messages in the archive", func() bool {
		for _, id := range first {
			if _, err := os.Stat(filepath.Join(dir, "out", "archive", id+".hl7")); err != nil {
				return false
			}
		}
		return true
	})

	// The partner goes away mid-stream: messages are still accepted and queue.
	sink.Stop(t, syscall.SIGINT)
	out, err = cluster.RunMefor(t, dir, env, "send", "--to", listen, "--count", "20", "--unique-ids", msgs)
	if err != nil {
		t.Fatalf("send while sink down: %v\n%s", err, out)
	}
	second := sentIDs(t, out)
	time.Sleep(time.Second)
	if n := len(controlIDsInDir(t, filepath.Join(dir, "sink1"))); n != 5 {
		t.Fatalf("sink saw %d messages while stopped", n)
	}

	cluster.StartProc(t, dir, env, "sink", "--listen", downstream, "--dir", "sink2", "--quiet")
	cluster.Eventually(t, 60*time.Second, "the queued messages at the restarted sink", func() bool {
		return len(controlIDsInDir(t, filepath.Join(dir, "sink2"))) >= len(second)
	})
	if got := controlIDsInDir(t, filepath.Join(dir, "sink2")); !slices.Equal(got, second) {
		t.Fatalf("restarted sink received %v, want %v (in order, none lost, none twice)", got, second)
	}

	cluster.Eventually(t, 30*time.Second, "every message processed", func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM mefor_message WHERE status = 'processed'").Scan(&n)
		return n == 25
	})
	node.Stop(t, syscall.SIGTERM)
	if node.Cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("mefor run exited %d after SIGTERM", node.Cmd.ProcessState.ExitCode())
	}

	// A clean stop leaves the node listed as left, holding nothing, and the
	// lease free for another node at once rather than after its TTL.
	out, err = cluster.RunMefor(t, dir, env, "nodes", "--json")
	if err != nil {
		t.Fatalf("nodes: %v\n%s", err, out)
	}
	var nodes []struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		HoldsLease bool   `json:"holds_lease"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("nodes --json: %v\n%s", err, out)
	}
	if len(nodes) != 1 || nodes[0].Status != "left" || nodes[0].HoldsLease {
		t.Errorf("after SIGTERM: nodes = %+v, want qs left and not holding the lease", nodes)
	}
	var free bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT expires_at < clock_timestamp() FROM mefor_leader_lease`).Scan(&free); err != nil || !free {
		t.Errorf("lease still live after a clean stop (err %v)", err)
	}
}

// A node killed with SIGKILL mid-stream and started again loses nothing it
// acknowledged, keeps the lane's order, and duplicates at most the sends of
// the record window open at each kill: record_batch rows per lane per kill
// (a long window here, so that the rows bound is what holds).
func TestCrashSafetySIGKILL(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	env := []string{"DATABASE_URL=" + db.URL}
	listen := fixtures.FreeAddr(t)

	const recordRows = 8
	// The partner is in this process, so it sees every delivery, including
	// the duplicates a crash may cause.
	var mu sync.Mutex
	var delivered []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	partner := &mllp.Server{Handler: mllp.HandlerFunc(func(_ context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		m, err := hl7.Parse(raw)
		if err != nil {
			return nil
		}
		mu.Lock()
		delivered = append(delivered, m.ControlID())
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // a partner that takes a moment, so kills land mid-delivery
		return hl7.NewACK(m, hl7.AckAccept, "", hl7.NewControlID(), time.Now())
	})}
	go partner.Serve(ln)
	t.Cleanup(func() { _ = partner.Shutdown(context.Background()) })
	start := crashNode(t, dir, env, fmt.Sprintf(`
channels:
  adt:
    inbound: {mllp: {listen: %q}}
    routes: [{name: out, destinations: [downstream]}]
destinations:
  downstream:
    type: mllp
    mllp: {address: %q}
    retry: {max_attempts: 0, backoff: 100ms, max_backoff: 1s}
    record_batch: {rows: %d, window: 1s}
`, listen, ln.Addr().String(), recordRows))

	const total, kills = 300, 2
	var acked []string
	client := &mllp.Client{Addr: listen, AckTimeout: 10 * time.Second, DialTimeout: time.Second}
	defer client.Close()
	node := start()
	cluster.WaitListening(t, listen)
	for i := 0; i < total; i++ {
		if i > 0 && i%(total/(kills+1)) == 0 && i < total-10 {
			node.Stop(t, syscall.SIGKILL)
			node = start()
			cluster.WaitListening(t, listen)
		}
		id := fmt.Sprintf("K%04d", i)
		msg := []byte("MSH|^~\\&|A|B|C|D|20240101||ADT^A01|" + id + "|P|2.5\rPID|1||" + id + "\r")
		raw, err := client.Send(context.Background(), msg)
		if err != nil {
			continue // the node died under this message: not acknowledged, the sender still owns it
		}
		if ack, err := hl7.ParseACK(raw); err == nil && ack.Code == hl7.AckAccept {
			acked = append(acked, id)
		}
	}
	if len(acked) < total-kills*2 {
		t.Fatalf("only %d of %d messages acknowledged", len(acked), total)
	}

	cluster.Eventually(t, 90*time.Second, "every acknowledged message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]bool{}
		for _, id := range delivered {
			seen[id] = true
		}
		for _, id := range acked {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	mu.Lock()
	got := slices.Clone(delivered)
	mu.Unlock()

	// Order: the first deliveries, duplicates removed, follow send order.
	var firsts []string
	seen := map[string]bool{}
	for _, id := range got {
		if !seen[id] {
			seen[id] = true
			firsts = append(firsts, id)
		}
	}
	if !slices.IsSorted(firsts) { // ids are zero-padded in send order
		t.Fatalf("deliveries out of order: %v", firsts)
	}
	if dups := len(got) - len(firsts); dups > kills*recordRows {
		t.Fatalf("%d duplicate deliveries for %d kills; at most a record window (%d sends) per kill may repeat", dups, kills, recordRows)
	}
	t.Logf("acked %d of %d, delivered %d (%d duplicates) across %d SIGKILLs", len(acked), total, len(got), len(got)-len(firsts), kills)
}

// checkAdmin reads the admin endpoints of a lone node that holds the
// listener lease, as a load balancer's health check or a dashboard would.
func checkAdmin(t *testing.T, addr, nodeID string) {
	t.Helper()
	get := func(path string, v any) int {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: decode: %v", path, err)
		}
		return resp.StatusCode
	}
	var h struct {
		Status     string `json:"status"`
		Node       string `json:"node"`
		HoldsLease bool   `json:"holds_lease"`
	}
	if code := get("/healthz", &h); code != 200 || h.Status != "ok" || h.Node != nodeID || !h.HoldsLease {
		t.Errorf("/healthz = %d %+v, want 200 ok from %s holding the lease", code, h, nodeID)
	}
	var st struct {
		LeaseHolder string `json:"lease_holder"`
		Nodes       int    `json:"nodes"`
	}
	if code := get("/cluster/status", &st); code != 200 || st.LeaseHolder != nodeID || st.Nodes != 1 {
		t.Errorf("/cluster/status = %d %+v, want %s holding the lease of 1 node", code, st, nodeID)
	}
	var nodes []struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		HoldsLease bool   `json:"holds_lease"`
	}
	cluster.Eventually(t, 10*time.Second, "the node listed as active lease holder", func() bool {
		if code := get("/cluster/nodes", &nodes); code != 200 {
			t.Fatalf("/cluster/nodes answered %d", code)
		}
		return len(nodes) == 1 && nodes[0].ID == nodeID && nodes[0].Status == "active" && nodes[0].HoldsLease
	})
}

// logPipelineOnFailure logs, if the test fails, each lane's backlog and its
// drainer's River job as the database holds them at that moment: what a
// stalled lane's post-mortem needs and the node's log does not say (which
// row heads the lane, when it is due, and what state its drainer is in).
// Register it after the database, so it runs before the database goes.
func logPipelineOnFailure(t *testing.T, db *testcontainers.DB) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := db.Pool.Query(ctx, `
			SELECT l.name, coalesce(w.pending, 0), coalesce(w.head_id, 0), coalesce(w.head_attempts, 0),
			       coalesce(to_char(w.head_due, 'HH24:MI:SS.MS'), '-'),
			       coalesce(l.job_id, 0), coalesce(j.state::text, '-'), coalesce(j.attempt, 0),
			       coalesce(to_char(j.scheduled_at, 'HH24:MI:SS.MS'), '-'),
			       coalesce(array_to_string(j.attempted_by, ','), '-'),
			       coalesce(to_char(now(), 'HH24:MI:SS.MS'), '-')
			FROM mefor_lane l
			LEFT JOIN river_job j ON j.id = l.job_id
			LEFT JOIN LATERAL (
				SELECT count(*) AS pending,
				       (array_agg(id ORDER BY seq))[1] AS head_id,
				       (array_agg(attempts ORDER BY seq))[1] AS head_attempts,
				       (array_agg(next_attempt_at ORDER BY seq))[1] AS head_due
				FROM mefor_work WHERE lane = l.name AND status = 'pending') w ON true
			ORDER BY l.name`)
		if err != nil {
			t.Logf("pipeline at failure: %v", err)
			return
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var lane, due, state, sched, by, now string
			var pending, head, attempts, job, jobAttempt int64
			if err := rows.Scan(&lane, &pending, &head, &attempts, &due, &job, &state, &jobAttempt, &sched, &by, &now); err != nil {
				t.Logf("pipeline at failure: %v", err)
				return
			}
			fmt.Fprintf(&b, "  %s: %d pending, head work %d (attempts %d, due %s); drainer job %d %s attempt %d scheduled %s by [%s]; now %s\n",
				lane, pending, head, attempts, due, job, state, jobAttempt, sched, by, now)
		}
		rows.Close()
		jobs, err := db.Pool.Query(ctx, `
			SELECT id, kind, coalesce(args->>'lane', ''), state::text, attempt,
			       to_char(scheduled_at, 'HH24:MI:SS.MS'), coalesce(array_to_string(attempted_by, ','), '-')
			FROM river_job WHERE state NOT IN ('completed', 'cancelled', 'discarded') ORDER BY id`)
		if err != nil {
			t.Logf("pipeline at failure: %v", err)
			return
		}
		defer jobs.Close()
		b.WriteString("  River jobs not finished:\n")
		for jobs.Next() {
			var id int64
			var attempt int
			var kind, lane, state, sched, by string
			if err := jobs.Scan(&id, &kind, &lane, &state, &attempt, &sched, &by); err != nil {
				t.Logf("pipeline at failure: %v", err)
				return
			}
			fmt.Fprintf(&b, "    job %d %s %s %s attempt %d scheduled %s by [%s]\n", id, kind, lane, state, attempt, sched, by)
		}
		t.Logf("pipeline at failure:\n%s", b.String())
	})
}
