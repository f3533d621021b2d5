package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

// wantErr is an expected problem: its line, its field path and a part of
// its message.
type wantErr struct {
	line  int
	field string
	msg   string
}

// parse parses doc, dropping the newline after the opening backquote so
// that the first line of the raw string is line 1.
func parse(t *testing.T, doc string, env map[string]string) (*config.Config, error) {
	t.Helper()
	getenv := func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
	return config.Parse("test.yaml", []byte(strings.TrimPrefix(doc, "\n")), getenv)
}

// checkErrs checks that err holds exactly the wanted problems, in order.
func checkErrs(t *testing.T, err error, want []wantErr) {
	t.Helper()
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("got error %v (%T), want config.Errors", err, err)
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(errs), len(want), err)
	}
	for i, w := range want {
		e := errs[i]
		if e.File != "test.yaml" || e.Line != w.line || e.Field != w.field || !strings.Contains(e.Message, w.msg) {
			t.Errorf("problem %d:\n got line %d, field %q, message %q\nwant line %d, field %q, message containing %q",
				i, e.Line, e.Field, e.Message, w.line, w.field, w.msg)
		}
	}
}

// invalid is a file that must not load, and the problems it must report.
type invalid struct {
	name string
	doc  string
	env  map[string]string
	want []wantErr
}

// checkInvalid parses each case's doc after prefix (which the case's line
// numbers count) and checks that it gives no config and exactly the
// wanted problems.
func checkInvalid(t *testing.T, prefix string, tests []invalid) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse(t, prefix+strings.TrimPrefix(tt.doc, "\n"), tt.env)
			if c != nil {
				t.Errorf("got a config along with %v", err)
			}
			checkErrs(t, err, tt.want)
		})
	}
}

// checkErrText checks that err is config.Errors whose text holds every one
// of want and nowhere quotes secret (a value from the file that must not
// reach logs).
func checkErrText(t *testing.T, err error, secret string, want []string) {
	t.Helper()
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse = %v, want config.Errors", err)
	}
	text := err.Error()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("errors lack %q:\n%s", w, text)
		}
	}
	if strings.Contains(text, secret) {
		t.Errorf("an error quotes %q:\n%s", secret, text)
	}
}

// outDest ends a test document with the destination out its routes name.
const outDest = `destinations:
  out: {type: mllp, mllp: {address: "127.0.0.1:2576"}}
`

const minimal = `
channels:
  adt:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - destinations: [out]
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
`

// aliasBomb returns a file of n lines whose aliases expand to 2^n values.
func aliasBomb(n int) string {
	var b strings.Builder
	b.WriteString("\na0: &a0 [x]\n")
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d]\n", i, i, i-1, i-1)
	}
	return b.String()
}

func TestParseDefaults(t *testing.T) {
	c, err := parse(t, minimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Cluster{
		Heartbeat:    time.Second,
		FenceTimeout: 3 * time.Second,
		LeaseTTL:     5 * time.Second,
		NodeTimeout:  15 * time.Second,

		ListenerPriority: 1,
	}
	if c.Cluster != want {
		t.Errorf("cluster = %+v, want %+v", c.Cluster, want)
	}

	ch := c.Channel("adt")
	if ch == nil {
		t.Fatal("channel adt missing")
	}
	in := ch.Inbound.MLLP
	if in == nil || in.Listen != "127.0.0.1:2575" || in.MaxFrameSize != 1<<20 ||
		in.ReadTimeout != 30*time.Second || in.IdleTimeout != 5*time.Minute {
		t.Errorf("inbound = %+v", in)
	}
	if ch.AckAfter != config.AckAfterReceived {
		t.Errorf("ack_after = %q", ch.AckAfter)
	}
	r := ch.Route("adt#0")
	if r == nil {
		t.Fatalf("route adt#0 missing; routes: %+v", ch.Routes)
	}
	if r.Handler != "passthrough" || len(r.Destinations) != 1 || r.Destinations[0] != "out" {
		t.Errorf("route = %+v", r)
	}
	if h := c.Handler(r.Handler); h == nil || h.Type != config.HandlerPassthrough {
		t.Errorf("Handler(passthrough) = %+v", h)
	}

	d := c.Destination("out")
	if d == nil || d.MLLP == nil {
		t.Fatalf("destination out = %+v", d)
	}
	if *d.MLLP != (config.MLLPDestination{Address: "127.0.0.1:2576", ConnectTimeout: 5 * time.Second, AckTimeout: 30 * time.Second, AEIsFailure: true}) {
		t.Errorf("mllp = %+v", *d.MLLP)
	}
	if d.Ordering != (config.Ordering{Mode: config.OrderFIFO, Lanes: 1}) {
		t.Errorf("ordering = %+v", d.Ordering)
	}
	if d.Retry != (config.Retry{MaxAttempts: 0, InitialBackoff: time.Second, Multiplier: 2, MaxBackoff: 5 * time.Minute}) {
		t.Errorf("retry = %+v", d.Retry)
	}
	if d.OnReject != config.RejectDeadLetter {
		t.Errorf("on_reject = %q, want %q: a partner's AR means it will never take the message", d.OnReject, config.RejectDeadLetter)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", c.Warnings)
	}
	if c.Channel("nope") != nil || c.Destination("nope") != nil || c.Handler("nope") != nil || ch.Route("nope") != nil {
		t.Error("lookups of unknown names should return nil")
	}
}

func TestParseFull(t *testing.T) {
	c, err := parse(t, `
cluster: {heartbeat: 500ms, fence_timeout: 2s, lease_ttl: 4s, node_timeout: 1m, listener_priority: 0}
channels:
  lab:
    inbound:
      mllp: {listen: ":2577", max_frame_size: 512KiB, read_timeout: 10s, idle_timeout: 1h, plaintext: true, allow: [10.1.0.0/16, 10.9.9.9], max_connections: 40, max_connections_per_ip: 4}
    routes:
      - name: results
        match:
          message_type: ORU
          trigger_event: [R01]
          sending_facility: [LAB1, LAB2]
          processing_id: [P, T]
          version: ["2.5.1"]
        handler: fix-lab
        destinations: [emr, archive]
  adt:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - destinations: emr
handlers:
  fix-lab:
    type: map
    map:
      - set: {path: MSH-5, value: EMR}
      - copy: {from: PID-3.1, to: PID-2}
      - clear: {path: PID-19}
destinations:
  emr:
    type: mllp
    mllp: {address: emr.example:2576, connect_timeout: 1s, ack_timeout: 1m, ae_is_failure: False}
    ordering: {mode: partitioned, lanes: 8, key: PID-3.1}
    retry: {max_attempts: 10, backoff: 250ms, multiplier: 1.5, max_backoff: 1m}
    on_reject: retry
  archive:
    type: file
    file: {directory: /var/lib/mefor/archive, filename: "{{.Channel}}/{{.ControlID}}.hl7"}
    ordering: {mode: parallel, lanes: 4}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{c.Channels[0].Name, c.Channels[1].Name}; got[0] != "lab" || got[1] != "adt" {
		t.Errorf("channels out of declaration order: %v", got)
	}
	if c.Cluster.NodeTimeout != time.Minute || c.Cluster.ListenerPriority != 0 {
		t.Errorf("node_timeout = %v, listener_priority = %d; want 1m and 0", c.Cluster.NodeTimeout, c.Cluster.ListenerPriority)
	}
	lab := c.Channel("lab")
	if in := lab.Inbound.MLLP; in.MaxFrameSize != 512<<10 || in.IdleTimeout != time.Hour || !in.Plaintext ||
		!slices.Equal(in.Allow, []string{"10.1.0.0/16", "10.9.9.9"}) || in.MaxConnections != 40 || in.MaxConnectionsPerIP != 4 {
		t.Errorf("inbound = %+v", lab.Inbound.MLLP)
	}
	if in := c.Channel("adt").Inbound.MLLP; in.Allow != nil || in.MaxConnections != 256 || in.MaxConnectionsPerIP != 16 {
		t.Errorf("inbound defaults: allow %v, max_connections %d, max_connections_per_ip %d; want any source, 256 and 16",
			in.Allow, in.MaxConnections, in.MaxConnectionsPerIP)
	}
	r := lab.Route("results")
	if r == nil {
		t.Fatal("route results missing")
	}
	m := r.Match
	if len(m.MessageType) != 1 || m.MessageType[0] != "ORU" || len(m.SendingFacility) != 2 || m.Version[0] != "2.5.1" {
		t.Errorf("match = %+v", m)
	}
	if c.Channel("adt").Routes[0].Destinations[0] != "emr" {
		t.Errorf("single destination not read as a list: %+v", c.Channel("adt").Routes[0])
	}
	wantOps := []config.MapOp{
		{Kind: config.MapSet, Target: "MSH-5", Value: "EMR"},
		{Kind: config.MapCopy, Target: "PID-2", From: "PID-3.1"},
		{Kind: config.MapClear, Target: "PID-19"},
	}
	h := c.Handler("fix-lab")
	if h == nil || h.Type != config.HandlerMap || len(h.Map) != len(wantOps) {
		t.Fatalf("handler = %+v", h)
	}
	for i, op := range h.Map {
		if op != wantOps[i] {
			t.Errorf("map[%d] = %+v, want %+v", i, op, wantOps[i])
		}
	}
	emr := c.Destination("emr")
	if emr.MLLP.AEIsFailure || emr.MLLP.AckTimeout != time.Minute {
		t.Errorf("mllp = %+v", emr.MLLP)
	}
	if emr.Ordering != (config.Ordering{Mode: config.OrderPartitioned, Lanes: 8, Key: "PID-3.1"}) {
		t.Errorf("ordering = %+v", emr.Ordering)
	}
	if emr.Retry != (config.Retry{MaxAttempts: 10, InitialBackoff: 250 * time.Millisecond, Multiplier: 1.5, MaxBackoff: time.Minute}) {
		t.Errorf("retry = %+v", emr.Retry)
	}
	if emr.OnReject != config.RejectRetry {
		t.Errorf("on_reject = %q, want retry", emr.OnReject)
	}
	archive := c.Destination("archive")
	if archive.Type != config.DestinationFile || archive.File.Directory != "/var/lib/mefor/archive" || archive.MLLP != nil {
		t.Errorf("archive = %+v", archive)
	}
}

// TestValidation runs every rule on a small file and checks the line, the
// field and the message of what it reports, and that nothing else is
// reported along with it.
func TestValidation(t *testing.T) {
	checkInvalid(t, "", []invalid{
		{
			name: "empty file",
			doc:  ``,
			want: []wantErr{{1, "channels", "must define at least one channel"}},
		},
		{
			name: "file is a list",
			doc: `
- adt
`,
			want: []wantErr{{1, "", "the file must be a block of settings"}},
		},
		{
			name: "yaml syntax error",
			doc: `
channels:
  adt:
    inbound: [
`,
			want: []wantErr{{3, "", "invalid YAML: did not find expected node content"}},
		},
		{
			name: "second document",
			doc: `
channels: {}
---
destinations: {}
`,
			want: []wantErr{{2, "", "second YAML document"}},
		},
		{
			name: "alias to its own ancestor",
			doc: `
cluster: &x {k: &y {<<: *x}, <<: *y}
`,
			want: []wantErr{{1, "", "invalid YAML: alias *x refers to a node that contains it"}},
		},
		{
			name: "alias bomb",
			doc:  aliasBomb(30),
			want: []wantErr{{0, "", "invalid YAML: aliases expand the file to more than"}},
		},
		{
			name: "unknown top-level key",
			doc: `
channels:
  adt:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - destinations: [out]
destination:
  out: {}
`,
			want: []wantErr{
				{6, "channels.adt.routes[0].destinations[0]", `"out" is not defined`},
				{7, "destination", "is not a known key; did you mean destinations?"},
			},
		},
		{
			name: "unknown key without a close match",
			doc: `
cluster:
  colour: blue
` + minimal,
			want: []wantErr{{2, "cluster.colour", "is not a known key (allowed here: heartbeat, fence_timeout, lease_ttl, node_timeout, listener_priority)"}},
		},
		{
			name: "duplicate key",
			doc: `
cluster:
  heartbeat: 1s
  heartbeat: 2s
` + minimal,
			want: []wantErr{{3, "cluster.heartbeat", "is set twice (first on line 2)"}},
		},
		{
			name: "duplicate name",
			doc: minimal + `
  out:
    type: file
    file: {directory: x}
`,
			want: []wantErr{{12, "destinations.out", "is defined twice (first on line 8)"}},
		},
		{
			name: "bad name",
			doc: `
channels:
  ADT In:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - destinations: [out]
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
`,
			want: []wantErr{{2, `channels.ADT In`, `must match ^[a-z0-9][a-z0-9_.-]*$`}},
		},
		{
			name: "heartbeat not below fence_timeout",
			doc: `
cluster:
  heartbeat: 3s
  fence_timeout: 3s
` + minimal,
			want: []wantErr{{2, "cluster.heartbeat", "breaks heartbeat < fence_timeout < lease_ttl (got heartbeat 3s, fence_timeout 3s, lease_ttl 5s (default))"}},
		},
		{
			name: "negative listener_priority",
			doc: `
cluster:
  listener_priority: -1
` + minimal,
			want: []wantErr{{2, "cluster.listener_priority", "must be from 0 (never take the listeners) to 1000, got -1"}},
		},
		{
			name: "fence_timeout not below lease_ttl",
			doc: `
cluster:
  lease_ttl: 2s
` + minimal,
			want: []wantErr{{2, "cluster.lease_ttl", "(got heartbeat 1s (default), fence_timeout 3s (default), lease_ttl 2s): a node must be able to miss a heartbeat without fencing itself, and must have fenced itself before its lease expires and another node takes over; e.g. heartbeat: 400ms, fence_timeout: 1.2s, lease_ttl: 2s"}},
		},
		{
			name: "node_timeout not above lease_ttl",
			doc: `
cluster:
  node_timeout: 5s
` + minimal,
			want: []wantErr{{2, "cluster.node_timeout", "(5s) must be longer than lease_ttl (5s (default))"}},
		},
		{
			name: "durations",
			doc: `
cluster:
  heartbeat: 1
  fence_timeout: soon
  lease_ttl: 0s
` + minimal,
			want: []wantErr{
				{2, "cluster.heartbeat", `"1" needs a unit: write 1s for seconds`},
				{3, "cluster.fence_timeout", `"soon" is not a duration`},
				{4, "cluster.lease_ttl", "must be > 0 (e.g. lease_ttl: 5s)"},
			},
		},
		{
			name: "channel without inbound and routes",
			doc: `
channels:
  adt: {}
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
`,
			want: []wantErr{{2, "channels.adt.inbound", "is required: where the channel receives messages"}},
		},
		{
			name: "inbound without mllp",
			doc: `
channels:
  adt:
    inbound: {}
    routes: [{destinations: [out]}]
` + outDest,
			want: []wantErr{{3, "channels.adt.inbound", "needs an mllp: or a file: block"}},
		},
		{
			name: "listen",
			doc: `
channels:
  a:
    inbound: {mllp: {}}
    routes: [{destinations: [out]}]
  b:
    inbound: {mllp: {listen: 127.0.0.1}}
    routes: [{destinations: [out]}]
  c:
    inbound: {mllp: {listen: "127.0.0.1:http"}}
    routes: [{destinations: [out]}]
  d:
    inbound: {mllp: {listen: "127.0.0.1:70000"}}
    routes: [{destinations: [out]}]
  e:
    inbound: {mllp: {listen: "::1:2575"}}
    routes: [{destinations: [out]}]
  f:
    inbound: {mllp: {listen: 2575}}
    routes: [{destinations: [out]}]
` + outDest,
			want: []wantErr{
				{3, "channels.a.inbound.mllp.listen", "is required"},
				{6, "channels.b.inbound.mllp.listen", `"127.0.0.1" needs a port, e.g. 127.0.0.1:2575`},
				{9, "channels.c.inbound.mllp.listen", `has port "http"; ports are numbers from 1 to 65535`},
				{12, "channels.d.inbound.mllp.listen", `has port "70000"`},
				{15, "channels.e.inbound.mllp.listen", "write IPv6 addresses in brackets"},
				{18, "channels.f.inbound.mllp.listen", `"2575" is only a port; write host:port, e.g. 127.0.0.1:2575, or :2575 for all interfaces`},
			},
		},
		{
			name: "listen addresses overlap",
			doc: `
channels:
  a:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [out]}]
  b:
    inbound: {mllp: {listen: "127.0.0.2:2575"}}
    routes: [{destinations: [out]}]
  c:
    inbound: {mllp: {listen: ":2575", plaintext: true}}
    routes: [{destinations: [out]}]
  d:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [out]}]
` + outDest,
			want: []wantErr{
				{9, "channels.c.inbound.mllp.listen", `:2575 overlaps channel "a", which listens on 127.0.0.1:2575`},
				{12, "channels.d.inbound.mllp.listen", `overlaps channel "a"`},
			},
		},
		{
			name: "max_frame_size",
			doc: `
channels:
  a:
    inbound: {mllp: {listen: "127.0.0.1:2575", max_frame_size: 1MB}}
    routes: [{destinations: [out]}]
  b:
    inbound: {mllp: {listen: "127.0.0.1:2576", max_frame_size: 2GiB}}
    routes: [{destinations: [out]}]
  c:
    inbound: {mllp: {listen: "127.0.0.1:2577", max_frame_size: 0, read_timeout: -1s}}
    routes: [{destinations: [out]}]
` + outDest,
			want: []wantErr{
				{3, "channels.a.inbound.mllp.max_frame_size", "sizes use binary units; did you mean 1MiB?"},
				{6, "channels.b.inbound.mllp.max_frame_size", "must be from 1 byte to 1GiB"},
				{9, "channels.c.inbound.mllp.max_frame_size", "must be from 1 byte to 1GiB"},
				{9, "channels.c.inbound.mllp.read_timeout", "must be > 0 (e.g. read_timeout: 30s)"},
			},
		},
		{
			name: "ack_after",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    ack_after: delivered
    routes: [{destinations: [out]}]
` + outDest,
			want: []wantErr{{4, "channels.adt.ack_after", `"delivered" is not supported; allowed values: received`}},
		},
		{
			name: "route references",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes:
      - handler: fix-lb
        destinations: [out, out, ouy, nowhere]
      - destinations: []
handlers:
  fix-lab:
    type: map
    map: [{clear: {path: PID-19}}]
` + outDest,
			want: []wantErr{
				{5, "channels.adt.routes[0].handler", `"fix-lb" is not defined (declare it under handlers:, or use the built-in passthrough); did you mean "fix-lab"?`},
				{6, "channels.adt.routes[0].destinations[1]", `"out" is listed twice`},
				{6, "channels.adt.routes[0].destinations[2]", `"ouy" is not defined (declare it under destinations:); did you mean "out"?`},
				{6, "channels.adt.routes[0].destinations[3]", `"nowhere" is not defined (declare it under destinations:)`},
				{7, "channels.adt.routes[1].destinations", "must list at least one destination (e.g. destinations: [out])"},
			},
		},
		{
			name: "route names",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes:
      - {name: out, destinations: [out]}
      - {name: out, destinations: [out]}
      - {name: Out!, destinations: [out]}
` + outDest,
			want: []wantErr{
				{6, "channels.adt.routes[1].name", `"out" is already the name of routes[0]`},
				{7, "channels.adt.routes[2].name", `name "Out!" must match`},
			},
		},
		{
			name: "match",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes:
      - match:
          message_type: [adt, ADT1]
          trigger_event: []
          processing_id: [X]
          sending_facility: [" LAB"]
          receving_facility: [LAB]
        destinations: [out]
` + outDest,
			want: []wantErr{
				{6, "channels.adt.routes[0].match.message_type[0]", `"adt" is not a message type: HL7 codes are upper case and compared exactly; did you mean "ADT"?`},
				{6, "channels.adt.routes[0].match.message_type[1]", `"ADT1" is not a message type: three upper-case letters or digits`},
				{7, "channels.adt.routes[0].match.trigger_event", "lists no values, so the route would match nothing"},
				{8, "channels.adt.routes[0].match.processing_id[0]", `"X" is not a processing ID`},
				{9, "channels.adt.routes[0].match.sending_facility[0]", "surrounding spaces"},
				{10, "channels.adt.routes[0].match.receving_facility", "did you mean receiving_facility?"},
			},
		},
		{
			name: "handler types",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{handler: a, destinations: [out]}, {handler: b, destinations: [out]}, {handler: c, destinations: [out]}, {handler: d, destinations: [out]}]
handlers:
  a: {map: [{clear: {path: PID-19}}]}
  b: {type: mapp}
  c: {type: map}
  d: {type: passthrough, map: []}
  passthrough: {type: map, map: [{clear: {path: PID-19}}]}
` + outDest,
			want: []wantErr{
				{6, "handlers.a.type", "is required: say what kind of handler this is, one of passthrough, map, javascript (e.g. type: map)"},
				{7, "handlers.b.type", `"mapp" is not a handler type; did you mean map? (one of passthrough, map, javascript)`},
				{8, "handlers.c.type", "map needs a map: block with its settings, e.g. map: [{set: {path: MSH-5, value: LAB}}]"},
				{9, "handlers.d.map", "only applies to type: map, but this is type: passthrough"},
				{10, "handlers.passthrough", "passthrough is the name of the built-in handler"},
			},
		},
		{
			name: "map ops",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{handler: fix, destinations: [out]}]
handlers:
  fix:
    type: map
    map:
      - set: {path: MSH-2, value: "^~\\&"}
      - copy: {from: PID.3, to: PID-2}
      - set: {path: PID-5}
        clear: {path: PID-5}
      - clear: {}
      - set: {path: MSH(2)-5, value: x}
      - {}
      - delete: {path: PID-5}
  empty:
    type: map
    map: []
` + outDest,
			want: []wantErr{
				{9, "handlers.fix.map[0].set.path", "MSH-2 can't be changed: MSH-1 and MSH-2 define the message's delimiters"},
				{10, "handlers.fix.map[1].copy.from", `"PID.3" is not a valid HL7 location: separate segment and field with '-', not '.': PID-3`},
				{11, "handlers.fix.map[2]", "has set and clear in one item"},
				{13, "handlers.fix.map[3].clear.path", "is required: an HL7 location such as PID-3.1"},
				{14, "handlers.fix.map[4].set.path", "can't be changed: a message has exactly one MSH segment"},
				{15, "handlers.fix.map[5]", "is empty; write one of set, copy or clear"},
				{16, "handlers.fix.map[6].delete", "is not a known key (allowed here: set, copy, clear, lookup)"},
				{19, "handlers.empty.map", "lists no edits"},
			},
		},
		{
			name: "destination types",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b, c, d, e]}]
destinations:
  a: {mllp: {address: "127.0.0.1:2576"}}
  b: {type: smtp}
  c: {type: mllp}
  d: {type: file, file: {directory: x}, mllp: {address: "127.0.0.1:2576"}}
  e: {type: mllp, mllp: {}}
`,
			want: []wantErr{
				{6, "destinations.a.type", "is required: say what kind of destination this is, one of mllp, file, http (e.g. type: mllp)"},
				{7, "destinations.b.type", `"smtp" is not a destination type (one of mllp, file, http)`},
				{8, "destinations.c.type", "mllp needs a mllp: block with its settings, e.g. mllp: {address: 127.0.0.1:2576}"},
				{9, "destinations.d.mllp", "only applies to type: mllp, but this is type: file"},
				{10, "destinations.e.mllp.address", "is required: the receiver's host:port"},
			},
		},
		{
			name: "mllp destination",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b]}]
destinations:
  a:
    type: mllp
    mllp: {address: ":2576", connect_timeout: 0s, ack_timeout: 30}
  b:
    type: mllp
    mllp: {address: "lab:2576", ae_is_failure: yes}
`,
			want: []wantErr{
				{8, "destinations.a.mllp.address", `":2576" needs a host, e.g. 127.0.0.1:2576`},
				{8, "destinations.a.mllp.connect_timeout", "must be > 0 (e.g. connect_timeout: 5s)"},
				{8, "destinations.a.mllp.ack_timeout", `"30" needs a unit`},
				{11, "destinations.b.mllp.ae_is_failure", `"yes" is not true or false`},
			},
		},
		{
			name: "file destination",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b, c, d]}]
destinations:
  a: {type: file, file: {}}
  b: {type: file, file: {directory: x, filename: "{{.ControlID"}}
  c: {type: file, file: {directory: x, filename: "{{.ControlId}}.hl7"}}
  d: {type: file, file: {directory: x, filename: "../{{.MessageID}}.hl7"}}
`,
			want: []wantErr{
				{6, "destinations.a.file.directory", "is required: where to write the files (e.g. directory: ./out/a; relative to mefor's working directory)"},
				{7, "destinations.b.file.filename", `"{{.ControlID" is not a valid template`},
				{8, "destinations.c.file.filename", "can't evaluate field ControlId"},
				{9, "destinations.d.file.filename", `gives "../01J9Z3K5E8X7Q2M4N6P8R0T2V4.hl7", which is empty, absolute or outside the directory`},
			},
		},
		{
			name: "ordering",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b, c, d, e, f, g]}]
destinations:
  a: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: fifo, lanes: 4}}
  b: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: parallel}}
  c: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: parallel, lanes: 1}}
  d: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: partitioned, lanes: 300, key: PID-3.1}}
  e: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: partitioned, lanes: 2}}
  f: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: partitioned, lanes: 2, key: PID-3-1}}
  g: {type: mllp, mllp: {address: "h:1"}, ordering: {mode: fifoo, key: PID-3}}
`,
			want: []wantErr{
				{6, "destinations.a.ordering.lanes", "must be 1 with mode: fifo"},
				{7, "destinations.b.ordering.lanes", "is required with mode: parallel"},
				{8, "destinations.c.ordering.lanes", "for a single lane use mode: fifo"},
				{9, "destinations.d.ordering.lanes", "must be from 2 to 256"},
				{10, "destinations.e.ordering.key", "is required with mode: partitioned"},
				{11, "destinations.f.ordering.key", `"PID-3-1" is not a valid HL7 location: use '.' between field and component, e.g. PID-3.1`},
				{12, "destinations.g.ordering.mode", `"fifoo" is not an ordering mode (one of fifo, parallel, partitioned); did you mean fifo?`},
			},
		},
		{
			name: "on_reject",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b]}]
destinations:
  a: {type: mllp, mllp: {address: "h:1"}, on_reject: deadletter}
  b: {type: mllp, mllp: {address: "h:1"}, on_reject: drop}
`,
			want: []wantErr{
				{6, "destinations.a.on_reject", `"deadletter" is not an on_reject policy (one of dead-letter, retry); did you mean dead-letter?`},
				{7, "destinations.b.on_reject", `"drop" is not an on_reject policy (one of dead-letter, retry)`},
			},
		},
		{
			name: "key without partitioned",
			doc: minimal + `    ordering: {mode: parallel, lanes: 2, key: PID-3.1}
`,
			want: []wantErr{{11, "destinations.out.ordering.key", "only applies to mode: partitioned"}},
		},
		{
			name: "retry",
			doc: `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, b]}]
destinations:
  lab:
    type: mllp
    mllp: {address: "h:1"}
    retry:
      max_attempts: -1
      backoff: 0s
      multiplier: 0.5
  b:
    type: mllp
    mllp: {address: "h:1"}
    retry: {backoff: 1m, max_backoff: 30s, max_attempts: lots}
`,
			want: []wantErr{
				{10, "destinations.lab.retry.max_attempts", "must be 0 (retry forever) or more"},
				{11, "destinations.lab.retry.backoff", "must be > 0 (e.g. backoff: 1s)"},
				{12, "destinations.lab.retry.multiplier", "must be a number of at least 1"},
				{16, "destinations.b.retry.max_backoff", "(30s) must be at least backoff (1m) (e.g. max_backoff: 5m)"},
				{16, "destinations.b.retry.max_attempts", `"lots" is not a whole number`},
			},
		},
		{
			name: "block where a value belongs and the reverse",
			doc: `
cluster: 5s
channels:
  adt:
    inbound:
      mllp:
        listen: [127.0.0.1:2575]
    routes: {destinations: [out]}
destinations:
  out: {type: mllp, mllp: {address: "h:1"}}
`,
			want: []wantErr{
				{1, "cluster", `must be a block of settings (key: value), not the value "5s"`},
				{6, "channels.adt.inbound.mllp.listen", "must be a single value, not a list"},
				{7, "channels.adt.routes", "must be a list, not a block of settings"},
			},
		},
		{
			name: "unset variable",
			doc: `
channels:
  adt:
    inbound:
      mllp: {listen: "${ADT_LISTEN}"}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: "${OUT_HOST}:${OUT_PORT:-2576}"}}
`,
			env:  map[string]string{"OUT_HOST": "lab.example"},
			want: []wantErr{{4, "channels.adt.inbound.mllp.listen", "uses ${ADT_LISTEN}, but ADT_LISTEN is not set in the environment; set it or give a default, e.g. ${ADT_LISTEN:-value}"}},
		},
		{
			name: "malformed variable references",
			doc: `
channels:
  adt:
    inbound:
      mllp: {listen: "${ADT LISTEN}"}
    routes: [{destinations: ["${OUT"]}]
destinations:
  out: {type: mllp, mllp: {address: "h:1"}}
`,
			want: []wantErr{
				{4, "channels.adt.inbound.mllp.listen", "${ADT LISTEN}, which is not a variable reference"},
				{5, "channels.adt.routes[0].destinations[0]", `has an unterminated "${OUT"`},
			},
		},
	})
}

// TestErrorsAllAtOnce checks that problems all over a file are reported
// together, in file order, and how they read.
func TestErrorsAllAtOnce(t *testing.T) {
	_, err := parse(t, `
cluster:
  heartbeet: 1s
channels:
  adt:
    inbound:
      mllp: {listen: 127.0.0.1:2575}
    routes:
      - destinations: [lab]
destinations:
  lab:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    retry:
      backoff: 0s
  lab:
    type: file
`, nil)
	checkErrs(t, err, []wantErr{
		{2, "cluster.heartbeet", "did you mean heartbeat?"},
		{14, "destinations.lab.retry.backoff", "must be > 0"},
		{15, "destinations.lab", "is defined twice (first on line 10)"},
	})
	want := `test.yaml:2: cluster.heartbeet is not a known key; did you mean heartbeat? (allowed here: heartbeat, fence_timeout, lease_ttl, node_timeout, listener_priority)
test.yaml:14: destination "lab": retry.backoff must be > 0 (e.g. backoff: 1s)
test.yaml:15: destination "lab": is defined twice (first on line 10); names must be unique`
	if got := err.Error(); got != want {
		t.Errorf("error text:\n%s\nwant:\n%s", got, want)
	}
	var one config.Error
	if !errors.As(err, &one) || one.Line != 2 {
		t.Errorf("errors.As(err, *config.Error) = %v, first problem %+v", errors.As(err, &one), one)
	}
}

func TestEnvironment(t *testing.T) {
	doc := `
channels:
  adt:
    inbound:
      mllp:
        listen: ${LISTEN_HOST:-127.0.0.1}:${LISTEN_PORT}
        read_timeout: ${READ_TIMEOUT:-30s}
    routes: [{destinations: [out]}]
destinations:
  out:
    type: file
    file: {directory: "${ARCHIVE}", filename: "$${literal}-{{.MessageID}}"}
    retry: {max_attempts: "${ATTEMPTS}"}
`
	tests := []struct {
		name   string
		env    map[string]string
		listen string
		read   time.Duration
		dir    string
	}{
		{
			name:   "defaults",
			env:    map[string]string{"LISTEN_PORT": "2575", "ARCHIVE": "/archive", "ATTEMPTS": "3"},
			listen: "127.0.0.1:2575",
			read:   30 * time.Second,
			dir:    "/archive",
		},
		{
			name:   "set",
			env:    map[string]string{"LISTEN_HOST": "127.0.0.5", "LISTEN_PORT": "3000", "READ_TIMEOUT": "5s", "ARCHIVE": "", "ATTEMPTS": "3"},
			listen: "127.0.0.5:3000",
			read:   5 * time.Second,
			dir:    "",
		},
		{
			name:   "empty value takes the default",
			env:    map[string]string{"LISTEN_HOST": "", "LISTEN_PORT": "2575", "ARCHIVE": "/a", "ATTEMPTS": "3"},
			listen: "127.0.0.1:2575",
			read:   30 * time.Second,
			dir:    "/a",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse(t, doc, tt.env)
			if tt.dir == "" {
				// An empty directory is still an error, found after
				// interpolation.
				checkErrs(t, err, []wantErr{{11, "destinations.out.file.directory", "is required"}})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			in := c.Channel("adt").Inbound.MLLP
			if in.Listen != tt.listen || in.ReadTimeout != tt.read {
				t.Errorf("listen %q, read_timeout %v; want %q, %v", in.Listen, in.ReadTimeout, tt.listen, tt.read)
			}
			out := c.Destination("out")
			if out.File.Directory != tt.dir || out.File.Filename != "${literal}-{{.MessageID}}" || out.Retry.MaxAttempts != 3 {
				t.Errorf("file %+v, retry %+v", out.File, out.Retry)
			}
		})
	}

	t.Run("missing", func(t *testing.T) {
		_, err := parse(t, doc, map[string]string{"ARCHIVE": "/a"})
		checkErrs(t, err, []wantErr{
			{5, "channels.adt.inbound.mllp.listen", "but LISTEN_PORT is not set"},
			{12, "destinations.out.retry.max_attempts", "but ATTEMPTS is not set"},
		})
		if !strings.Contains(err.Error(), "test.yaml:5: ") {
			t.Errorf("error doesn't name file and line: %v", err)
		}
	})

	t.Run("comments and keys are not interpolated", func(t *testing.T) {
		_, err := parse(t, "# ${NOT_SET}\n"+strings.TrimPrefix(minimal, "\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
	})
}

func TestAnchorsAndMerge(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b]}]
destinations:
  a:
    type: mllp
    mllp: {address: "h:1"}
    retry: &retry {max_attempts: 5, backoff: 2s}
  b:
    type: mllp
    mllp: {address: "h:2"}
    retry:
      <<: *retry
      max_attempts: 7
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Destination("a").Retry, c.Destination("b").Retry
	if a.MaxAttempts != 5 || a.InitialBackoff != 2*time.Second {
		t.Errorf("a: %+v", a)
	}
	if b.MaxAttempts != 7 || b.InitialBackoff != 2*time.Second || b.Multiplier != 2 {
		t.Errorf("b: %+v", b)
	}
}

func TestWarnings(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
  idle:
    inbound: {mllp: {listen: 127.0.0.1:2576}}
handlers:
  spare: {type: map, map: [{clear: {path: PID-19}}]}
destinations:
  out: {type: mllp, mllp: {address: "localhost:1"}}
  extra: {type: file, file: {directory: x}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []wantErr{
		{5, "channels.idle.routes", "is empty: every message the channel receives will be stored as unrouted"},
		{8, "handlers.spare", "is not used by any route"},
		{11, "destinations.extra", "is not used by any route"},
	}
	checkErrs(t, config.Errors(c.Warnings), want)
}

func TestQuickstartExample(t *testing.T) {
	const file = "../../examples/quickstart/mefor.yaml"
	c, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) > 0 {
		t.Errorf("warnings: %v", config.Errors(c.Warnings))
	}
	if c.Cluster.Heartbeat != time.Second || c.Cluster.FenceTimeout != 3*time.Second || c.Cluster.LeaseTTL != 5*time.Second {
		t.Errorf("cluster = %+v", c.Cluster)
	}
	adt := c.Channel("adt")
	if adt == nil || adt.Inbound.MLLP.Listen != "127.0.0.1:2575" || len(adt.Routes) != 1 {
		t.Fatalf("channel adt = %+v", adt)
	}
	r := adt.Routes[0]
	if r.Handler != "passthrough" || strings.Join(r.Destinations, ",") != "downstream,archive" {
		t.Errorf("route = %+v", r)
	}
	down := c.Destination("downstream")
	if down.Type != config.DestinationMLLP || down.MLLP.Address != "127.0.0.1:2576" ||
		down.Ordering.Mode != config.OrderFIFO || down.Retry.MaxAttempts != 0 {
		t.Errorf("downstream = %+v", down)
	}
	archive := c.Destination("archive")
	if archive.Type != config.DestinationFile || archive.File.Directory != "./out/archive" {
		t.Errorf("archive = %+v", archive)
	}

	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if c.Hash() != hex.EncodeToString(sum[:]) {
		t.Errorf("Hash() = %s, want the SHA-256 of the file", c.Hash())
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := config.Load("testdata/does-not-exist.yaml")
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want one wrapping os.ErrNotExist", err)
	}
}

func TestHashChangesWithContent(t *testing.T) {
	a, err := parse(t, minimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parse(t, minimal+"# a comment\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash() == b.Hash() || len(a.Hash()) != 64 {
		t.Errorf("hashes %s and %s", a.Hash(), b.Hash())
	}
}

func TestMatch(t *testing.T) {
	m := config.Match{MessageType: []string{"ADT"}, TriggerEvent: []string{"A01", "A04"}}
	tests := []struct {
		h    config.MessageHeader
		want bool
	}{
		{config.MessageHeader{MessageType: "ADT", TriggerEvent: "A01"}, true},
		{config.MessageHeader{MessageType: "ADT", TriggerEvent: "A04", SendingFacility: "X"}, true},
		{config.MessageHeader{MessageType: "ADT", TriggerEvent: "A08"}, false},
		{config.MessageHeader{MessageType: "ORU", TriggerEvent: "A01"}, false},
		{config.MessageHeader{MessageType: "adt", TriggerEvent: "A01"}, false},
	}
	for _, tt := range tests {
		if got := m.Matches(tt.h); got != tt.want {
			t.Errorf("Matches(%+v) = %v, want %v", tt.h, got, tt.want)
		}
	}
	var all config.Match
	if !all.Matches(config.MessageHeader{}) {
		t.Error("an empty match should accept everything")
	}
}

func TestFileDestinationPath(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b]}]
destinations:
  a: {type: file, file: {directory: out}}
  b: {type: file, file: {directory: /srv/b, filename: "{{.Channel}}/{{.Received.Format \"2006-01-02\"}}/{{.ControlID}}.hl7"}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := config.FileNameData{MessageID: "m1", ControlID: "C1", Channel: "adt", Received: time.Date(2024, 5, 6, 0, 0, 0, 0, time.UTC)}
	tests := []struct {
		dest string
		data config.FileNameData
		want string
		ok   bool
	}{
		{"a", data, "out/m1.hl7", true},
		{"b", data, "/srv/b/adt/2024-05-06/C1.hl7", true},
		// MSH-10 comes from the sender: it must not pick the path. Its
		// separators are replaced, so the file stays in the directory.
		{"b", config.FileNameData{ControlID: "../../../etc/passwd", Channel: "adt"}, "/srv/b/adt/0001-01-01/.._.._.._etc_passwd.hl7", true},
		{"b", config.FileNameData{ControlID: "..", Channel: "adt"}, "/srv/b/adt/0001-01-01/__.hl7", true},
		{"a", config.FileNameData{MessageID: "/abs"}, "", false},
	}
	for _, tt := range tests {
		got, err := c.Destination(tt.dest).File.Path(tt.data)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("%s: Path(%+v) = %q, %v; want %q (ok %v)", tt.dest, tt.data, got, err, tt.want, tt.ok)
		}
	}

	// A FileDestination built by hand works too.
	f := &config.FileDestination{Directory: "d", Filename: config.DefaultFilename}
	if got, err := f.Path(data); err != nil || got != "d/m1.hl7" {
		t.Errorf("hand-built Path = %q, %v", got, err)
	}
}
