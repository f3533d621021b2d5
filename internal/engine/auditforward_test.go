package engine_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/auditforward"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The audit trail leaves only through the egress policy: with both
// audit.forward targets' name resolving elsewhere than where the config
// was loaded, neither the syslog receiver nor the webhook gets a
// connection, each refusal is counted under its target, and the cursors
// say why nothing was sent.
func TestAuditForwardGoesThroughTheEgressPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	if err := audit.AppendAlone(ctx, db.Pool, audit.Entry{Action: audit.ActionReload}); err != nil {
		t.Fatal(err)
	}
	var syslogConns, posts atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			syslogConns.Add(1)
			c.Close()
		}
	}()
	hook := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { posts.Add(1) }))
	defer hook.Close()
	_, syslogPort, _ := net.SplitHostPort(ln.Addr().String())
	_, hookPort, _ := net.SplitHostPort(hook.Listener.Addr().String())

	lab := newPartner(t, "127.0.0.2:0", rejectAll)
	listen := fixtures.FreeAddr(t)
	_, cfg := configFile(t, "forward.yaml", "egress: {allow: [127.0.0.2, localhost]}\n"+fixtures.ADTChannel(listen)+`
      - destinations: [lab]
destinations:
`+stuckLab(lab.addr)+fmt.Sprintf(`audit:
  forward:
    interval: 1s
    retry_min: 50ms
    retry_max: 100ms
    syslog: {address: "localhost:%s"}
    webhook: {url: "https://localhost:%s/audit"}
`, syslogPort, hookPort))
	n := cluster.StartNode(t, db, cfg, func(o *engine.Options) { o.EgressResolver = newDNSAnswer("127.0.0.2") })

	fixtures.Eventually(t, 30*time.Second, "both targets' connections refused", func() bool {
		return egressRefusals(t, n, "audit_forward:syslog") >= 1 && egressRefusals(t, n, "audit_forward:webhook") >= 1
	})
	if s, p := syslogConns.Load(), posts.Load(); s != 0 || p != 0 {
		t.Fatalf("the receivers got %d syslog connections and %d POSTs while their name resolved elsewhere", s, p)
	}
	fixtures.Eventually(t, 30*time.Second, "both cursors to say egress refused", func() bool {
		cs, err := auditforward.Cursors(ctx, db.Pool)
		if err != nil || len(cs) != 2 {
			return false
		}
		for _, c := range cs {
			if c.Seq != 0 || !strings.Contains(c.LastError, "egress: audit_forward:"+c.Target+" may not connect") {
				return false
			}
		}
		return true
	})
}
