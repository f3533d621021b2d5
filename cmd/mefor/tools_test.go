package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// mefor send talks to mefor sink over real sockets: every message gets AA,
// the sink keeps each one as a file, and send exits 0.
func TestSendToSink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr := fixtures.FreeAddr(t)
	sink := cluster.StartProc(t, dir, nil, "sink", "--listen", addr, "--dir", "got")
	cluster.WaitListening(t, addr)

	msgs, _ := filepath.Abs("../../examples/quickstart/adt.hl7")
	out, err := cluster.RunMefor(t, dir, nil, "send", "--to", addr, msgs)
	if err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	ids := sentIDs(t, out)
	want := []string{"MSG00001", "MSG00002", "MSG00003", "MSG00004", "MSG00005"}
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("send reported %v, want %v", ids, want)
	}
	cluster.Eventually(t, 10*time.Second, "5 files at the sink", func() bool { return len(controlIDsInDir(t, filepath.Join(dir, "got"))) == 5 })
	if got := controlIDsInDir(t, filepath.Join(dir, "got")); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("sink kept %v, want %v", got, want)
	}
	sink.Stop(t, syscall.SIGINT)
	if !strings.Contains(sink.Out.String(), "received 5 messages") {
		t.Fatalf("sink summary missing:\n%s", sink.Out.String())
	}
}

// A receiver that answers AE makes send exit non-zero and say so per message.
func TestSendExitsNonZeroOnNegativeAck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr := fixtures.FreeAddr(t)
	cluster.StartProc(t, dir, nil, "sink", "--listen", addr, "--ack", "AE", "--quiet")
	cluster.WaitListening(t, addr)
	msgs, _ := filepath.Abs("../../examples/quickstart/adt.hl7")
	out, err := cluster.RunMefor(t, dir, nil, "send", "--to", addr, msgs)
	if err == nil {
		t.Fatalf("send exited 0 although every ACK was AE:\n%s", out)
	}
	if !strings.Contains(out, "MSG00001\tAE") || !strings.Contains(out, "5 of 5 messages were not accepted") {
		t.Fatalf("send output does not report the AE answers:\n%s", out)
	}
	// Nothing listening: each message is reported refused.
	out, err = cluster.RunMefor(t, dir, nil, "send", "--to", fixtures.FreeAddr(t), msgs)
	if err == nil || !strings.Contains(out, "\trefused") {
		t.Fatalf("send to a closed port: err %v, output:\n%s", err, out)
	}
}

// config check names the file, the line, the field and the fix, reports
// every problem at once, and exits 1.
func TestConfigCheckReportsEveryProblem(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	err := os.WriteFile(path, []byte(`channels:
  adt:
    inbound:
      mllp: {listen: "127.0.0.1:2575"}
    routes:
      - destinations: [lab]
destinations:
  lab:
    type: mllp
    mllp: {address: "127.0.0.1:2576"}
    retry:
      backoff: 0s
      max_backof: 5m
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"config", "check", path}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit code %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		path + ":12:", `destination "lab"`, "retry.backoff must be > 0", "backoff: 1s",
		path + ":13:", "max_backof", "did you mean max_backoff",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	stdout.Reset()
	if code := run([]string{"config", "check", "../../examples/quickstart/mefor.yaml"}, &stdout, &stderr); code != 0 {
		t.Fatalf("quickstart config: exit %d\n%s", code, stdout.String())
	}
}

// --help lists every command, and every command's help has an example.
func TestHelpListsCommandsWithExamples(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	commands := []string{"run", "migrate", "config check", "enqueue", "messages", "dead", "replay",
		"replay-dead", "cancel", "status", "send", "sink"}
	for _, c := range commands {
		if !strings.Contains(stdout.String(), "  "+c+" ") {
			t.Errorf("--help does not list %q:\n%s", c, stdout.String())
		}
	}
	for _, c := range []string{"run", "migrate", "config check", "enqueue", "messages list", "messages show",
		"dead list", "replay", "replay-dead", "cancel", "status", "send", "sink"} {
		stdout.Reset()
		args := append(strings.Fields(c), "--help")
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Errorf("%s --help exit %d", c, code)
		}
		if !strings.Contains(stdout.String(), "Example") || !strings.Contains(stdout.String(), "mefor "+strings.Fields(c)[0]) {
			t.Errorf("%s --help has no example:\n%s", c, stdout.String())
		}
	}
}
