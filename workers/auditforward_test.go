package workers_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mefor/mefor/internal/alert"
	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
)

// siem is a remote partner that takes audit batches over HTTPS: it keeps
// what it accepted, in order, and refuses everything while down.
type siem struct {
	down    atomic.Bool
	mu      sync.Mutex
	seqs    []int64
	anchors []int64
	token   string
	badAuth atomic.Int64
}

func (s *siem) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != s.token {
		s.badAuth.Add(1)
		http.Error(w, "who are you", http.StatusUnauthorized)
		return
	}
	if s.down.Load() {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
		return
	}
	var b struct {
		Source string `json:"source"`
		Items  []struct {
			Kind   string              `json:"kind"`
			Row    *audit.Record       `json:"row"`
			Anchor *audit.StoredAnchor `json:"anchor"`
		} `json:"items"`
	}
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.Source != "mefor" {
		http.Error(w, "bad batch", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range b.Items {
		switch {
		case it.Kind == "audit" && it.Row != nil:
			s.seqs = append(s.seqs, it.Row.Seq)
		case it.Kind == "anchor" && it.Anchor != nil:
			s.anchors = append(s.anchors, it.Anchor.No)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *siem) got() (seqs, anchors []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.seqs...), append([]int64(nil), s.anchors...)
}

// River's leader forwards the audit trail to a webhook over HTTPS on its
// own: rows and anchors arrive in order; while the receiver refuses them
// the target falls behind, an audit_forward alert fires and the lag gauge
// shows it; once the receiver is back every row arrives, with no gap, and
// the alert resolves.
func TestLeaderForwardsTheAuditTrailToAWebhook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	for range 5 {
		if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionCancel,
			Target: map[string]any{"destination": "out"}}); err != nil {
			t.Fatal(err)
		}
	}
	rx := &siem{token: "Bearer s3cret"}
	rx.down.Store(true)
	srv := httptest.NewTLSServer(rx)
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "siem-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := adtToOut(t, `
audit:
  forward:
    interval: 1s
    batch_size: 3
    retry_min: 50ms
    retry_max: 200ms
    webhook:
      url: `+srv.URL+`/audit
      headers: {Authorization: "${SIEM_TOKEN}"}
      tls: {ca_file: `+caFile+`, server_name: example.com}
alerts:
  interval: 1s
  sinks: {ops: {log: {}}}
  rules:
    - {name: siem-behind, audit_forward: webhook, queue_depth: 1, sinks: [ops]}
`, map[string]string{"SIEM_TOKEN": rx.token})
	cluster.StartNode(t, db, cfg, nil)

	cluster.Poll(t, 60*time.Second, "the siem-behind alert firing while the receiver refuses", func() bool {
		as, err := alert.ListAlerts(ctx, db.Pool)
		return err == nil && len(as) == 1 && as[0].State == alert.AlertFiring
	})
	if seqs, _ := rx.got(); len(seqs) != 0 {
		t.Fatalf("the receiver accepted rows %v while refusing", seqs)
	}
	var cur auditforward.Cursor
	cluster.Poll(t, 60*time.Second, "the refusal recorded in the webhook's cursor", func() bool {
		c, err := auditforward.Cursors(ctx, db.Pool)
		if err != nil || len(c) != 1 {
			return false
		}
		cur = c[0]
		return cur.LastError != ""
	})
	if cur.Seq != 0 {
		t.Fatalf("cursor while refused: %+v, want it at row 0", cur)
	}
	if lag := gaugeValue(t, db, "mefor_audit_forward_lag_rows", "webhook"); lag < 5 {
		t.Errorf("mefor_audit_forward_lag_rows{target=webhook} = %v while 5 rows wait, want >= 5", lag)
	}

	rx.down.Store(false)
	for range 4 {
		if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionReplay,
			Target: map[string]any{"message_id": 7}}); err != nil {
			t.Fatal(err)
		}
	}
	var seqs, anchors []int64
	cluster.Poll(t, 60*time.Second, "rows 1 to 9 at the receiver", func() bool {
		seqs, anchors = rx.got()
		return len(seqs) >= 9
	})
	want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}
	if len(seqs) != len(want) {
		t.Fatalf("the receiver got rows %v, want %v once each", seqs, want)
	}
	for i := range want {
		if seqs[i] != want[i] {
			t.Fatalf("the receiver got rows %v, want %v in order", seqs, want)
		}
	}
	if len(anchors) == 0 || anchors[0] != 1 {
		t.Errorf("the receiver got anchors %v, want the leader's anchor 1 first", anchors)
	}
	if n := rx.badAuth.Load(); n != 0 {
		t.Errorf("%d POSTs came without the configured header", n)
	}
	cluster.Poll(t, 60*time.Second, "the siem-behind alert resolved", func() bool {
		as, err := alert.ListAlerts(ctx, db.Pool)
		return err == nil && len(as) == 1 && as[0].State == alert.AlertOK
	})
	if lag := gaugeValue(t, db, "mefor_audit_forward_lag_rows", "webhook"); lag != 0 {
		t.Errorf("mefor_audit_forward_lag_rows{target=webhook} = %v after catching up, want 0", lag)
	}
}

// gaugeValue reads a cluster gauge as /metrics would serve it.
func gaugeValue(t *testing.T, db *testcontainers.DB, name, target string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(&metrics.ClusterCollector{Pool: db.Pool, CacheTTL: time.Nanosecond})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && l.GetValue() == target {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("/metrics has no %s{target=%q}", name, target)
	return 0
}
