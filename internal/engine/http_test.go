package engine_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// hie is a partner reached over HTTPS with a real net/http server; answer
// decides each request's status from the message's control id and how many
// times it was received.
type hie struct {
	*httptest.Server
	ca     *certtest.CA
	mu     sync.Mutex
	got    []string // control ids, in arrival order
	at     map[string][]time.Time
	auth   []string
	answer func(id string, n int) (status int, retryAfter string)
}

func newHIE(t *testing.T, answer func(id string, n int) (int, string)) *hie {
	h := &hie{ca: certtest.NewCA(t, "HIE CA"), at: map[string][]time.Time{}, answer: answer}
	h.Server = httptest.NewUnstartedServer(http.HandlerFunc(h.serve))
	h.TLS = &tls.Config{Certificates: []tls.Certificate{h.ca.Issue(t, "hie", certtest.Options{}).TLS}}
	h.StartTLS()
	t.Cleanup(h.Close)
	return h
}

func (h *hie) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	msg, err := hl7.Parse(body)
	if err != nil {
		http.Error(w, "not HL7", http.StatusBadRequest)
		return
	}
	id := msg.ControlID()
	h.mu.Lock()
	h.got = append(h.got, id)
	h.at[id] = append(h.at[id], time.Now())
	h.auth = append(h.auth, r.Header.Get("Authorization"))
	status, retryAfter := h.answer(id, len(h.at[id]))
	h.mu.Unlock()
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	if status < 300 {
		w.Write(hl7.NewACK(msg, hl7.AckAccept, "", "HIE-"+id, time.Now()))
	}
}

func (h *hie) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// An HTTPS partner, verified against its CA: a 503 is retried when its
// Retry-After says (not at the policy's much shorter backoff), a 400 is
// dead-lettered and the lane moves on, order is kept, and each 2xx body is
// kept as the reply.
func TestHTTPDestinationRetriesDeadLettersAndKeepsOrder(t *testing.T) {
	db := testcontainers.NewDB(t)
	h := newHIE(t, func(id string, n int) (int, string) {
		switch {
		case id == "M2" && n <= 2:
			return http.StatusServiceUnavailable, "1"
		case id == "M3":
			return http.StatusBadRequest, ""
		}
		return http.StatusOK, ""
	})
	listen := fixtures.FreeAddr(t)
	cfg := testConfig(t, listen, fmt.Sprintf(`  hie:
    type: http
    http:
      url: %s/hl7?site=lab
      headers: {Authorization: "Bearer t0ken"}
      tls: {ca_file: %q}
    retry: {backoff: 50ms, max_backoff: 5s}
`, h.URL, h.ca.WriteFile(t, t.TempDir(), "ca.crt")))
	cluster.StartNode(t, db, cfg, nil)

	var msgs [][]byte
	for i := 1; i <= 5; i++ {
		msgs = append(msgs, adt(fmt.Sprintf("M%d", i), fmt.Sprintf("P%d", i)))
	}
	for i, ack := range send(t, listen, msgs...) {
		if ack.Code != hl7.AckAccept {
			t.Fatalf("message %d: %s", i+1, ack.Code)
		}
	}
	want := []string{"M1", "M2", "M2", "M2", "M3", "M4", "M5"}
	fixtures.Eventually(t, 20*time.Second, "every message sent", func() bool { return len(h.received()) >= len(want) })
	if got := h.received(); !slices.Equal(got, want) {
		t.Fatalf("partner got %v, want %v", got, want)
	}
	h.mu.Lock()
	at := h.at["M2"]
	auth := slices.Clone(h.auth)
	h.mu.Unlock()
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 900*time.Millisecond {
			t.Errorf("M2 retried after %s; the partner said Retry-After: 1", gap)
		}
	}
	for _, a := range auth {
		if a != "Bearer t0ken" {
			t.Fatalf("Authorization %q", a)
		}
	}

	ctx := context.Background()
	fixtures.Eventually(t, 10*time.Second, "every message final", func() bool {
		var pending int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_message WHERE status NOT IN ('processed', 'error')`).Scan(&pending)
		return pending == 0
	})
	rows, err := db.Pool.Query(ctx, `
		SELECT m.control_id, m.status, w.status, coalesce(w.last_error, ''),
			coalesce((SELECT detail FROM mefor_event e WHERE e.work_id = w.id AND e.event = 'dead'), ''),
			coalesce((SELECT convert_from(body, 'UTF8') FROM mefor_response r WHERE r.work_id = w.id ORDER BY id DESC LIMIT 1), '')
		FROM mefor_message m JOIN mefor_work w ON w.message_id = m.id AND w.stage = 'outbound'
		ORDER BY m.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, status, work, lastErr, dead, reply string
		if err := rows.Scan(&id, &status, &work, &lastErr, &dead, &reply); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(lastErr, "t0ken") || strings.Contains(lastErr, "site=lab") {
			t.Errorf("%s: last_error %q shows a header value or the query", id, lastErr)
		}
		switch id {
		case "M3":
			if status != "error" || work != "dead" || !strings.HasPrefix(lastErr, "http-4xx: ") || !strings.Contains(dead, "on_client_error: dead-letter") {
				t.Errorf("M3: message %s, row %s, last_error %q, dead %q; want dead-lettered at the first 400", status, work, lastErr, dead)
			}
		default:
			if status != "processed" || work != "done" || !strings.Contains(reply, "MSA|AA|"+id) {
				t.Errorf("%s: message %s, row %s, reply %q; want delivered with the body kept", id, status, work, reply)
			}
		}
	}
}
