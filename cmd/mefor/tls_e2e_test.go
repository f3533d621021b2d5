package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/certtest"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The TLS quickstart: mefor send --tls-* → a node listening with mutual
// TLS → mefor sink --tls-*, every hop verified both ways. The node
// records who sent each message; senders without the right certificate
// are refused and nothing of theirs is stored.
func TestTLSEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	dir := t.TempDir()
	env := []string{"DATABASE_URL=" + db.URL}

	ca := certtest.NewCA(t, "Quickstart CA")
	caFile := ca.WriteFile(t, dir, "ca.crt")
	nodeCrt, nodeKey := ca.Issue(t, "mefor-node", certtest.Options{}).WriteFiles(t, dir, "node")
	senderCrt, senderKey := ca.Issue(t, "registration", certtest.Options{}).WriteFiles(t, dir, "sender")
	sinkCrt, sinkKey := ca.Issue(t, "lab-system", certtest.Options{}).WriteFiles(t, dir, "sink")

	listen, downstream, adminAddr := fixtures.FreeAddr(t), fixtures.FreeAddr(t), fixtures.FreeAddr(t)
	cfg := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
channels:
  adt:
    inbound:
      mllp:
        listen: %q
        tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
    routes: [{destinations: [lab]}]
destinations:
  lab:
    type: mllp
    mllp:
      address: %q
      tls: {ca_file: %q, server_name: localhost, cert_file: %q, key_file: %q}
    retry: {backoff: 200ms, max_backoff: 1s}
`, listen, nodeCrt, nodeKey, caFile, downstream, caFile, nodeCrt, nodeKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	msgs, err := filepath.Abs("../../examples/quickstart/adt.hl7")
	if err != nil {
		t.Fatal(err)
	}

	sink := cluster.StartProc(t, dir, nil, "sink", "--listen", downstream, "--dir", "got",
		"--tls-cert", sinkCrt, "--tls-key", sinkKey, "--tls-client-ca", caFile)
	cluster.StartProc(t, dir, env, "run", "--migrate", "--config", cfg, "--node-id", "tls", "--admin-listen", adminAddr)
	cluster.WaitListening(t, downstream)
	cluster.WaitListening(t, listen)

	out, err := cluster.RunMefor(t, dir, nil, "send", "--to", listen, "--tls-ca", caFile, "--tls-cert", senderCrt, "--tls-key", senderKey, msgs)
	if err != nil {
		t.Fatalf("send over TLS: %v\n%s", err, out)
	}
	sent := sentIDs(t, out)
	if len(sent) != 5 {
		t.Fatalf("send reported %d messages, want 5:\n%s", len(sent), out)
	}
	cluster.Eventually(t, 30*time.Second, "5 messages at the TLS sink", func() bool { return len(controlIDsInDir(t, filepath.Join(dir, "got"))) == 5 })
	if got := controlIDsInDir(t, filepath.Join(dir, "got")); !slices.Equal(got, sent) {
		t.Fatalf("sink received %v, want %v in order", got, sent)
	}
	cluster.Eventually(t, 10*time.Second, "the sink naming the node's certificate", func() bool {
		return strings.Count(sink.Out.String(), "from CN=mefor-node,O=mefor tests") == 5
	})

	// Who sent it is on the message.
	var id int64
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM mefor_message WHERE control_id = $1`, sent[0]).Scan(&id); err != nil {
		t.Fatal(err)
	}
	out, err = cluster.RunMefor(t, dir, env, "messages", "show", fmt.Sprint(id))
	if err != nil || !strings.Contains(out, "Source identity:") || !strings.Contains(out, "CN=registration,O=mefor tests") {
		t.Errorf("messages show does not name the sender's certificate (%v):\n%s", err, out)
	}

	// Refused senders: each exits 1, and nothing of theirs is stored.
	for name, args := range map[string][]string{
		"plaintext":          {"send", "--to", listen, msgs},
		"no client cert":     {"send", "--to", listen, "--tls-ca", caFile, msgs},
		"untrusted listener": {"send", "--to", listen, "--tls-cert", senderCrt, "--tls-key", senderKey, msgs}, // system roots: the quickstart CA is not among them
	} {
		out, err := cluster.RunMefor(t, dir, nil, args...)
		if err == nil {
			t.Errorf("%s: send exited 0:\n%s", name, out)
		}
		if name != "plaintext" && !strings.Contains(out, "\ttls\n") {
			t.Errorf("%s: send did not report the TLS failure:\n%s", name, out)
		}
	}
	var stored int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM mefor_message`).Scan(&stored); err != nil || stored != 5 {
		t.Fatalf("%d messages stored (err %v), want only the 5 from the verified sender", stored, err)
	}

	// Status and the admin endpoint list the certificates in use.
	out, err = cluster.RunMefor(t, dir, env, "status")
	if err != nil || !strings.Contains(out, nodeCrt) || !strings.Contains(out, caFile) || !strings.Contains(out, `channel "adt" server certificate`) {
		t.Errorf("status does not list the certificates (%v):\n%s", err, out)
	}
	resp, err := http.Get("http://" + adminAddr + "/certificates")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var certs []struct {
		File     string    `json:"file"`
		Subject  string    `json:"subject"`
		NotAfter time.Time `json:"not_after"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&certs); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, c := range certs {
		files[c.File] = !c.NotAfter.IsZero()
	}
	if !files[nodeCrt] || !files[caFile] || len(files) != 2 {
		t.Errorf("/certificates lists %v, want the node's certificate and the CA with their expiry", files)
	}
}

// config check reads the TLS files as a starting node would, refuses a
// plaintext listener open to the network unless it says plaintext: true,
// and flags a TLS listener open to the network that asks for no client
// certificate.
func TestConfigCheckTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := certtest.NewCA(t, "CA")
	soonCrt, soonKey := ca.Issue(t, "soon", certtest.Options{NotAfter: time.Now().Add(10 * 24 * time.Hour)}).WriteFiles(t, dir, "soon")
	goneCrt, goneKey := ca.Issue(t, "gone", certtest.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}).
		WriteFiles(t, dir, "gone")
	writeWith := func(name, crt, key, plain string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(fmt.Sprintf(`
channels:
  adt:
    inbound:
      mllp:
        listen: 0.0.0.0:2575
        tls: {cert_file: %q, key_file: %q}
    routes: [{destinations: [out]}]
  plain:
    inbound: {mllp: {listen: "0.0.0.0:2576"%s}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: out}}
`, crt, key, plain)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write := func(name, crt, key string) string { return writeWith(name, crt, key, ", plaintext: true") }
	check := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"config", "check"}, args...), &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}

	code, out := check(write("soon.yaml", soonCrt, soonKey))
	if code != 0 || !strings.Contains(out, `warning: `) || !strings.Contains(out, `certificate "CN=soon,O=mefor tests"`) ||
		!strings.Contains(out, "in 9 days") {
		t.Errorf("a certificate expiring in 10 days: exit %d, want 0 with a warning:\n%s", code, out)
	}
	if !strings.Contains(out, `soon.yaml:7: channel "adt": inbound.mllp.tls accepts TLS from any client, without a certificate`) {
		t.Errorf("no warning for the TLS listener on 0.0.0.0 without client_ca_file:\n%s", out)
	}
	if strings.Contains(out, `channel "plain"`) {
		t.Errorf("the plaintext listener that says plaintext: true is flagged:\n%s", out)
	}

	code, out = check(writeWith("refused.yaml", soonCrt, soonKey, ""))
	if code != 1 || !strings.Contains(out, `refused.yaml:10: channel "plain": inbound.mllp.listen 0.0.0.0:2576 would accept plaintext MLLP from the network`) ||
		!strings.Contains(out, "set plaintext: true on this listener") {
		t.Errorf("a plaintext listener on 0.0.0.0: exit %d, want 1 naming file, line, field and fix:\n%s", code, out)
	}

	gone := write("gone.yaml", goneCrt, goneKey)
	code, out = check(gone)
	if code != 1 || !strings.Contains(out, `gone.yaml:7: channel "adt": inbound.mllp.tls.cert_file `+goneCrt) ||
		!strings.Contains(out, "expired on") {
		t.Errorf("an expired certificate: exit %d, want 1 naming file, line and field:\n%s", code, out)
	}
	if code, out = check("--no-tls-files", gone); code != 0 {
		t.Errorf("--no-tls-files still read the files: exit %d\n%s", code, out)
	}
}
