package script_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dop251/goja"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
)

const adt = "MSH|^~\\&|REG|HOSP|LAB|HOSP|20240101120000||ADT^A01^ADT_A01|MSG1|P|2.5.1\r" +
	"EVN|A01|20240101120000\r" +
	"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F|\"\"||A \\T\\ B\\F\\C\r" +
	"PV1|1|I|W1^101^A\r" +
	"OBX|1|NM|GLU||5.4\r" +
	"OBX|2|NM|NA||140\r"

// program compiles src as a one-file javascript handler.
func program(t testing.TB, src string, mod ...func(*config.JavaScript, *script.Options)) *script.Program {
	t.Helper()
	js := &config.JavaScript{
		Timeout: time.Second, OnError: config.ScriptDeadLetter,
		Scripts: []config.Script{{Path: "test.js", Source: src, Program: goja.MustCompile("test.js", src, false)}},
	}
	opts := script.Options{Handler: "h"}
	for _, m := range mod {
		m(js, &opts)
	}
	p, err := script.New(js, opts)
	if err != nil {
		t.Fatalf("script.New: %v", err)
	}
	return p
}

func parse(t testing.TB, raw string) *hl7.Message {
	t.Helper()
	m, err := hl7.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func run(t *testing.T, p *script.Program, in script.Input) ([]script.Output, error) {
	t.Helper()
	if in.Message == nil {
		in.Message = parse(t, adt)
	}
	if in.Destinations == nil {
		in.Destinations = []string{"lab", "archive"}
	}
	in.Route = "r"
	return p.Run(context.Background(), in)
}

// one runs src and returns its single output's message.
func one(t *testing.T, src string) *hl7.Message {
	t.Helper()
	outs, err := run(t, program(t, src), script.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Destinations != nil {
		t.Fatalf("outputs %+v, want one to every destination", outs)
	}
	return outs[0].Message
}

func TestGetDecodesLikeTheParser(t *testing.T) {
	t.Parallel()
	// Each expression's value is written into ZZZ-n, then read back in Go.
	exprs := []string{
		`msg.get("PID-3.1")`,      // first repetition by default
		`msg.get("PID-3[2].1")`,   // repetition
		`msg.get("PID-3[2].4")`,   // component of a repetition
		`msg.get("PID-5")`,        // whole field, separators kept
		`msg.get("PID-9")`,        // HL7 null is the two characters ""
		`msg.get("PID-10")`,       // empty field
		`msg.get("PID-30")`,       // absent field
		`msg.get("PID-11")`,       // escapes decoded
		`msg.get("OBX(2)-5")`,     // segment occurrence
		`typeof msg.get("ZZZ-1")`, // absent segment reads as ""
		`msg.get("MSH-2")`,        // encoding characters, literal
		`String(msg.get("PID-9") === '""')`,
	}
	var src strings.Builder
	src.WriteString("function transform(msg) {\n  var v = [")
	src.WriteString(strings.Join(exprs, ", "))
	src.WriteString("];\n  for (var i = 0; i < v.length; i++) msg.set(\"ZZZ-\" + (i + 1), v[i]);\n}\n")
	out := one(t, src.String())
	want := []string{"123", "456", "SSA", "DOE^JANE^Q", `""`, "", "", "A & B|C", "140", "string", "^~\\&", "true"}
	for i, w := range want {
		if got := out.Get(fmt.Sprintf("ZZZ-%d", i+1)); got != w {
			t.Errorf("%s = %q, want %q", exprs[i], got, w)
		}
	}
}

func TestSetEscapesAndCreates(t *testing.T) {
	t.Parallel()
	out := one(t, `function transform(msg) {
		msg.set("PID-5.1", "O'NEIL|SMITH^JR");   // delimiters in a value are escaped
		msg.set("PID-3[2].1", "999");            // one repetition, the others kept
		msg.set("ZVC-1", "3");                   // a missing segment is appended
		msg.set("PID-10", '""');                 // the HL7 null is written as is
		msg.set("PV1-44", 20240101);             // numbers are written as JavaScript prints them
	}`)
	raw := string(out.Encode())
	for _, want := range []string{
		`PID|1||123^^^HOSP^MR~999^^^SSA^SS||O'NEIL\F\SMITH\S\JR^JANE^Q||19700101|F|""|""|A \T\ B\F\C`,
		"\rZVC|3\r",
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("message lacks %q:\n%s", want, strings.ReplaceAll(raw, "\r", "\n"))
		}
	}
	if got := out.Get("PID-5.1"); got != "O'NEIL|SMITH^JR" {
		t.Errorf("PID-5.1 reads back %q", got)
	}
	if got := out.Get("PV1-44"); got != "20240101" {
		t.Errorf("PV1-44 = %q", got)
	}
	if ids := strings.Join(out.SegmentIDs(), ","); ids != "MSH,EVN,PID,PV1,OBX,OBX,ZVC" {
		t.Errorf("segments %s", ids)
	}
}

func TestSegmentsRemoveAdd(t *testing.T) {
	t.Parallel()
	out := one(t, `function transform(msg) {
		var obx = msg.segments("OBX");
		if (obx.length !== 2 || obx[1].name !== "OBX" || obx[1].occurrence !== 2) throw new Error("segments");
		obx.forEach(function (s) { s.set("5", s.get(5) + "!"); });
		if (msg.segments().length !== 6) throw new Error("all segments");
		if (obx[0].toString() !== "OBX|1|NM|GLU||5.4!") throw new Error("toString " + obx[0].toString());
		msg.addSegment("NTE|1||first^note", "OBX(1)");
		msg.addSegment("NTE|2||after the last OBX", "OBX");
		msg.addSegment("ZVC|1");
		if (msg.remove("EVN") !== 1) throw new Error("remove EVN");
		msg.remove("PID-3[2]");                      // an element is emptied in place
		msg.remove("PID-7");
	}`)
	if ids := strings.Join(out.SegmentIDs(), ","); ids != "MSH,PID,PV1,OBX,NTE,OBX,NTE,ZVC" {
		t.Errorf("segments %s", ids)
	}
	if got := out.Get("OBX(2)-5"); got != "140!" {
		t.Errorf("OBX(2)-5 = %q", got)
	}
	if got := out.Get("NTE(1)-3.2"); got != "note" {
		t.Errorf("added segment is not parsed with the message's delimiters: NTE-3.2 = %q", got)
	}
	if got, want := out.Get("PID-3"), "123^^^HOSP^MR~"; got != want {
		t.Errorf("PID-3 = %q, want %q", got, want)
	}
	if got := out.Get("PID-7"); got != "" || out.Get("PID-8") != "F" || out.Get("PID-9") != `""` {
		t.Errorf("remove shifted fields: PID-7 %q, PID-8 %q, PID-9 %q", got, out.Get("PID-8"), out.Get("PID-9"))
	}
}

func TestMessageIsNotShared(t *testing.T) {
	t.Parallel()
	in := parse(t, adt)
	before := string(in.Encode())
	p := program(t, `function transform(msg) { var c = msg.clone(); c.set("MSH-5", "B"); msg.set("MSH-5", "A"); return [msg, c]; }`)
	outs, err := run(t, p, script.Input{Message: in})
	if err != nil {
		t.Fatal(err)
	}
	if string(in.Encode()) != before {
		t.Error("the input message was modified")
	}
	if len(outs) != 2 || outs[0].Message.Get("MSH-5") != "A" || outs[1].Message.Get("MSH-5") != "B" {
		t.Errorf("outputs %v / %v", outs[0].Message.Get("MSH-5"), outs[1].Message.Get("MSH-5"))
	}
}

func TestResults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body string
		want       string // per output: MSH-10 and destinations; "filtered"; or an error substring
	}{
		{"nothing delivers msg", `msg.set("MSH-10", "X");`, "X:*"},
		{"null filters", `return null;`, "filtered"},
		{"empty array filters", `return [];`, "filtered"},
		{"a message", `var c = msg.clone(); c.set("MSH-10", "C"); return c;`, "C:*"},
		{"split in order", `var out = []; for (var i = 1; i <= 3; i++) { var c = msg.clone(); c.set("MSH-10", "S" + i); out.push(c); } return out;`,
			"S1:* S2:* S3:*"},
		{"destination subsets", `return [{message: msg, destinations: ["archive"]}, {message: msg.clone(), destinations: ["lab", "archive", "lab"]}];`,
			"MSG1:archive MSG1:lab,archive"},
		{"unknown destination", `return [{message: msg, destinations: ["billing"]}];`, `destination "billing" is not one of route "r"'s destinations (lab, archive)`},
		{"a string", `return "MSH|...";`, "transform returned a string"},
		{"a number in an array", `return [msg, 3];`, "element 1 of the returned array is a number"},
		{"an object", `return {foo: 1};`, "the result is a object, not a message"},
		{"a foreign object as message", `return {message: {}};`, "not a message of this transform"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			outs, err := run(t, program(t, "function transform(msg, ctx) {\n"+tt.body+"\n}"), script.Input{})
			var got string
			switch {
			case err != nil:
				got = err.Error()
			case len(outs) == 0:
				got = "filtered"
			default:
				var parts []string
				for _, o := range outs {
					d := "*"
					if o.Destinations != nil {
						d = strings.Join(o.Destinations, ",")
					}
					parts = append(parts, o.Message.ControlID()+":"+d)
				}
				got = strings.Join(parts, " ")
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if err != nil {
				var se *script.Error
				if !errors.As(err, &se) || se.Kind != script.KindResult {
					t.Errorf("error %v is not a result error", err)
				}
			}
		})
	}
}

func TestThrowNamesLineNotContent(t *testing.T) {
	t.Parallel()
	p := program(t, "function transform(msg) {\n  var id = msg.get('PID-3.1');\n  id.nosuch();\n}")
	_, err := run(t, p, script.Input{})
	var se *script.Error
	if !errors.As(err, &se) || se.Kind != script.KindException {
		t.Fatalf("error %v, want a script exception", err)
	}
	if !strings.HasPrefix(se.Where, "test.js:3:") || !strings.Contains(se.Message, "TypeError") {
		t.Errorf("error %q at %q, want a TypeError on test.js line 3", se.Message, se.Where)
	}
	if strings.Contains(err.Error(), "123") || strings.Contains(err.Error(), "DOE") {
		t.Errorf("error quotes message content: %v", err)
	}
	if errors.Is(err, handler.ErrNotReady) {
		t.Error("on_error: dead-letter failure matches ErrNotReady")
	}

	_, err = run(t, program(t, "function transform() { throw new Error('no visit number'); }"), script.Input{})
	if err == nil || !strings.Contains(err.Error(), "Error: no visit number (at test.js:1:30)") {
		t.Errorf("thrown Error: %v", err)
	}
}

func TestHoldMatchesNotReady(t *testing.T) {
	t.Parallel()
	p := program(t, "function transform() { throw new Error('not yet'); }", func(js *config.JavaScript, _ *script.Options) {
		js.OnError = config.ScriptHold
	})
	_, err := run(t, p, script.Input{})
	if !errors.Is(err, handler.ErrNotReady) {
		t.Errorf("on_error: hold failure %v does not match ErrNotReady", err)
	}
}

func TestRunawayIsInterrupted(t *testing.T) {
	t.Parallel()
	p := program(t, "var n = 0;\nfunction transform(msg) {\n  n++;\n  if (msg.get('MSH-10') === 'LOOP') { while (true) {} }\n}",
		func(js *config.JavaScript, _ *script.Options) { js.Timeout = 100 * time.Millisecond })
	start := time.Now()
	_, err := run(t, p, script.Input{Message: parse(t, strings.Replace(adt, "MSG1", "LOOP", 1))})
	var se *script.Error
	if !errors.As(err, &se) || se.Kind != script.KindTimeout || !strings.HasPrefix(se.Where, "test.js:4:") {
		t.Fatalf("runaway: %v (%+v)", err, se)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("interrupted after %s", d)
	}
	// The next message runs normally, on a runtime that was not interrupted.
	if _, err := run(t, p, script.Input{}); err != nil {
		t.Errorf("next message: %v", err)
	}

	p = program(t, "function f(n) { return f(n + 1) + 1; }\nfunction transform() { f(0); }")
	if _, err := run(t, p, script.Input{}); err == nil || !strings.Contains(err.Error(), "call depth") {
		t.Errorf("runaway recursion: %v", err)
	}
}

func TestSandbox(t *testing.T) {
	t.Parallel()
	out := one(t, `function transform(msg) {
		msg.set("ZZZ-1", [typeof require, typeof console, typeof process, typeof setTimeout, typeof fetch, typeof XMLHttpRequest].join(","));
	}`)
	if got := out.Get("ZZZ-1"); got != "undefined,undefined,undefined,undefined,undefined,undefined" {
		t.Errorf("globals available to scripts: %s", got)
	}
	// A message object kept from an earlier call cannot be used.
	p := program(t, "var kept;\nfunction transform(msg) { if (kept) { kept.get('PID-3'); } kept = msg; }")
	if _, err := run(t, p, script.Input{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, p, script.Input{}); err == nil || !strings.Contains(err.Error(), "not a message of this call") {
		t.Errorf("kept message: %v", err)
	}
}

func TestState(t *testing.T) {
	t.Parallel()
	p := program(t, `function transform(msg, ctx) {
		var id = msg.get("PID-3.1");
		var v = ctx.state.get("visits", id) || {count: 0};
		v.count++;
		ctx.state.set("visits", id, v);
		ctx.state.set("last", "patient", id);
		ctx.state.delete("old", id);
		msg.set("ZVC-1", v.count);
	}`)
	seeded := state.Map{{Namespace: "visits", Key: "123"}: {Value: json.RawMessage(`{"count":4}`), Version: 7}}
	b := state.NewBatch(seeded)
	var counts []string
	var changes []*state.Change
	for range 2 {
		row := b.Row()
		outs, err := run(t, p, script.Input{State: row})
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, outs[0].Message.Get("ZVC-1"))
		changes = append(changes, row.Commit())
	}
	// The second row sees the first one's write.
	if strings.Join(counts, ",") != "5,6" {
		t.Errorf("counts %v, want 5,6", counts)
	}
	// Only reads of committed values are checked in the hand-off; writes
	// and deletes read nothing.
	if r := changes[0].Reads; len(r) != 1 || r[0].Version != 7 {
		t.Errorf("first row reads %+v", r)
	}
	if len(changes[1].Reads) != 0 {
		t.Errorf("second row reads %+v, want none (it read the first row's writes)", changes[1].Reads)
	}
	w := changes[1].Writes
	if len(w) != 3 || string(w[0].Value) != `{"count":6}` || string(w[1].Value) != `"123"` || w[2].Value != nil {
		t.Errorf("second row writes %+v", w)
	}

	// Values must be JSON.
	for _, bad := range []string{`ctx.state.set("n", "k", function () {})`, `ctx.state.set("n", "k", undefined)`, `ctx.state.set("", "k", 1)`} {
		p := program(t, "function transform(msg, ctx) { "+bad+"; }")
		if _, err := run(t, p, script.Input{State: state.NewBatch(state.Map{}).Row()}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

type lookups map[string]string

func (l lookups) Lookup(set, key, column string) (string, bool, error) {
	if set == "pending" {
		return "", false, fmt.Errorf("reference set %q has no snapshot yet (%w)", set, handler.ErrNotReady)
	}
	if column != "" && column != "loinc" {
		return "", false, fmt.Errorf("reference set %q has no column %q", set, column)
	}
	v, ok := l[key]
	return v, ok, nil
}

func TestLookupAndLog(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var lines []string
	withSets := func(_ *config.JavaScript, o *script.Options) {
		o.Lookup = lookups{"GLU": "2345-7"}
		o.Sets = []string{"codes", "pending"}
	}
	p := program(t, `function transform(msg, ctx) {
		msg.set("ZZZ-1", ctx.lookup("codes", msg.get("OBX-3")));
		msg.set("ZZZ-2", String(ctx.lookup("codes", "nope")));
		msg.set("ZZZ-3", ctx.lookup("codes", "GLU", "loinc"));
		ctx.log.info("looked up", 2, {codes: 1});
		ctx.log.warn("ids", ctx.messageId, ctx.channel, ctx.route, ctx.destinations.join("+"));
	}`, withSets)
	outs, err := run(t, p, script.Input{MessageID: 42, Channel: "adt", Log: func(level slog.Level, text string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, level.String()+" "+text)
	}})
	if err != nil {
		t.Fatal(err)
	}
	m := outs[0].Message
	if m.Get("ZZZ-1") != "2345-7" || m.Get("ZZZ-2") != "null" || m.Get("ZZZ-3") != "2345-7" {
		t.Errorf("lookups %q %q %q", m.Get("ZZZ-1"), m.Get("ZZZ-2"), m.Get("ZZZ-3"))
	}
	if got := strings.Join(lines, "\n"); got != "INFO looked up 2 {\"codes\":1}\nWARN ids 42 adt r lab+archive" {
		t.Errorf("log lines:\n%s", got)
	}

	// A set without a snapshot holds the lane even if the script catches it.
	p = program(t, `function transform(msg, ctx) { try { ctx.lookup("pending", "x"); } catch (e) {} }`, withSets)
	if _, err := run(t, p, script.Input{}); !errors.Is(err, handler.ErrNotReady) {
		t.Errorf("lookup without snapshot: %v, want ErrNotReady", err)
	}
	// A set the config does not declare fails the message at once.
	p = program(t, `function transform(msg, ctx) { ctx.lookup("other", "x"); }`, withSets)
	if _, err := run(t, p, script.Input{}); err == nil || errors.Is(err, handler.ErrNotReady) || !strings.Contains(err.Error(), `"other" is not declared`) {
		t.Errorf("undeclared set: %v", err)
	}
}

func TestConcurrentRuns(t *testing.T) {
	t.Parallel()
	p := program(t, `var calls = 0; function transform(msg) { calls++; msg.set("ZZZ-1", msg.get("MSH-10")); }`)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 50 {
				id := fmt.Sprintf("C%d-%d", i, j)
				outs, err := p.Run(context.Background(), script.Input{Message: parse(t, strings.Replace(adt, "MSG1", id, 1))})
				if err != nil {
					t.Error(err)
					return
				}
				if got := outs[0].Message.Get("ZZZ-1"); got != id {
					t.Errorf("message %s came out as %s", id, got)
				}
			}
		})
	}
	wg.Wait()
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	p := program(t, "function transform() { while (true) {} }", func(js *config.JavaScript, _ *script.Options) { js.Timeout = 10 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := p.Run(ctx, script.Input{Message: parse(t, adt)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled run: %v, want the context's error (not the message's fault)", err)
	}
}

type panicking struct{}

func (panicking) Lookup(set, key, column string) (string, bool, error) { panic("index out of range") }

// A Go panic under the script (here from a lookup) fails only its message;
// the program keeps serving the next ones.
func TestPanicUnderTheScriptFailsItsMessage(t *testing.T) {
	t.Parallel()
	p := program(t, `function transform(msg, ctx) { if (msg.get("MSH-10") === "BOOM") ctx.lookup("codes", "x"); }`,
		func(_ *config.JavaScript, o *script.Options) { o.Lookup, o.Sets = panicking{}, []string{"codes"} })
	_, err := run(t, p, script.Input{Message: parse(t, strings.Replace(adt, "MSG1", "BOOM", 1))})
	var se *script.Error
	if !errors.As(err, &se) || se.Kind != script.KindCrash {
		t.Fatalf("panic under the script: %v, want an engine failure of the message", err)
	}
	if _, err := run(t, p, script.Input{}); err != nil {
		t.Errorf("the next message: %v", err)
	}
}
