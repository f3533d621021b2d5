package script_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/script"
)

// A catastrophic backtracking pattern (a backreference puts it on regexp2,
// not RE2) would run for ages inside one match, where the interrupt is not
// seen: the match timeout gives control back and the handler's timeout
// stops the script. The message then follows on_error.
func TestCatastrophicRegexpStoppedWithinTimeout(t *testing.T) {
	t.Parallel()
	src := `function transform(msg) {
		var s = new Array(40).join("a") + "!";
		while (true) { /^(a|a?)+\1$/.test(s); }
	}`
	for _, hold := range []bool{false, true} {
		p := program(t, src, func(js *config.JavaScript, _ *script.Options) {
			js.Timeout = 300 * time.Millisecond
			if hold {
				js.OnError = config.ScriptHold
			}
		})
		done := make(chan error, 1)
		start := time.Now()
		go func() { _, err := run(t, p, script.Input{}); done <- err }()
		select {
		case err := <-done:
			var se *script.Error
			if !errors.As(err, &se) || se.Kind != script.KindTimeout {
				t.Fatalf("catastrophic regexp: %v, want a timeout", err)
			}
			if got := strings.HasSuffix(err.Error(), "[on_error: hold]"); got != hold {
				t.Fatalf("on_error hold %v: error %q", hold, err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("stopped after %s, timeout 300ms", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the script is still matching after 10s: the match is not bounded")
		}
	}
}

// A loop that allocates without bound is interrupted once the heap has
// grown by the limit, long before its timeout, and the message follows
// on_error.
func TestRunawayAllocationInterrupted(t *testing.T) {
	// Not parallel: the check is on the process's heap.
	p := program(t, `function transform(msg) {
		var keep = [];
		while (true) { keep.push("x".repeat(65536) + keep.length); }
	}`, func(js *config.JavaScript, o *script.Options) {
		js.Timeout = 30 * time.Second
		o.MaxHeapGrowth = 32 << 20
	})
	start := time.Now()
	_, err := run(t, p, script.Input{})
	var se *script.Error
	if !errors.As(err, &se) || se.Kind != script.KindMemory {
		t.Fatalf("runaway allocation: %v, want kind %s", err, script.KindMemory)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("interrupted after %s", d)
	}
	if !strings.Contains(err.Error(), "allocated more than 32 MiB") {
		t.Fatalf("error %q", err)
	}
	// The node goes on: the next message runs on a fresh runtime.
	p2 := program(t, `function transform(msg) {}`)
	if _, err := run(t, p2, script.Input{}); err != nil {
		t.Fatalf("next message: %v", err)
	}
}

// ctx.log writes no content to the node's log unless the handler says
// log_content: true: a fixed message and the arguments' types and sizes.
func TestCtxLogWritesNoContentUnlessAllowed(t *testing.T) {
	t.Parallel()
	src := `function transform(msg, ctx) { ctx.log.info("patient", msg.get("PID-5.1"), 42, {name: msg.get("PID-5.2")}, [1, 2]); }`
	for _, allow := range []bool{false, true} {
		var buf bytes.Buffer
		p := program(t, src, func(js *config.JavaScript, o *script.Options) {
			js.LogContent = allow
			o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		})
		if _, err := run(t, p, script.Input{MessageID: 7, Channel: "adt"}); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		hasContent := strings.Contains(out, "DOE") || strings.Contains(out, "JANE") || strings.Contains(out, "patient") || strings.Contains(out, "42")
		if hasContent != allow {
			t.Fatalf("log_content %v: log %q", allow, out)
		}
		if !allow && !strings.Contains(out, `args="[string(7) string(3) number object(1 keys) array(2)]"`) {
			t.Fatalf("log without content: %q", out)
		}
		if !strings.Contains(out, "message_id=7") || !strings.Contains(out, "handler=h") {
			t.Fatalf("log line does not say where it comes from: %q", out)
		}
	}
}

// One catastrophic match, not retried: the engine would read it, once
// abandoned, as no match and the transform would go on with a wrong answer.
// The match is abandoned only after the handler's timeout is due, so the
// transform fails with a timeout instead of returning.
func TestAbandonedMatchFailsTheTransformInsteadOfReadingAsNoMatch(t *testing.T) {
	t.Parallel()
	p := program(t, `function transform(msg) {
		var s = new Array(40).join("a") + "!";
		if (/^(a|a?)+\1$/.test(s)) { throw new Error("cannot match"); }
		return msg;
	}`, func(js *config.JavaScript, _ *script.Options) { js.Timeout = 300 * time.Millisecond })
	_, err := run(t, p, script.Input{})
	var se *script.Error
	if !errors.As(err, &se) || se.Kind != script.KindTimeout {
		t.Fatalf("one abandoned match: %v, want the transform to fail with a timeout", err)
	}
}
