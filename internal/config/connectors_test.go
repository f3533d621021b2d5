package config_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

// These tests load the connectors' settings: file inbound, HTTP
// destinations, reply_to, and a destination's delivery policy (retry and
// record_batch).

func TestFileInboundLoadsWithDefaults(t *testing.T) {
	c, err := parse(t, `
channels:
  lab-files:
    inbound:
      file:
        directory: /data/inbox/lab
        pattern: "*.hl7"
        poll: 2s
        move_to: /data/inbox/lab/done
        error_dir: /data/inbox/lab/error
    routes: [{destinations: [out]}]
  drop:
    inbound: {file: {directory: ./drop, delete: true, error_dir: ./drop-errors}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := c.Channel("lab-files").Inbound.File
	want := config.FileInbound{Directory: "/data/inbox/lab", Pattern: "*.hl7", Poll: 2 * time.Second, Settle: time.Second,
		MoveTo: "/data/inbox/lab/done", ErrorDir: "/data/inbox/lab/error", MaxFileSize: 64 << 20}
	if in == nil || *in != want {
		t.Fatalf("file inbound %+v, want %+v", in, want)
	}
	if d := c.Channel("drop").Inbound.File; !d.Delete || d.Pattern != "*" || d.Poll != time.Second {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestFileInboundErrors(t *testing.T) {
	checkInvalid(t, "", []invalid{
		{
			name: "nothing but a directory",
			doc: `
channels:
  lab:
    inbound: {file: {directory: /in}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`,
			want: []wantErr{
				{3, "channels.lab.inbound.file.move_to", "is required (or delete: true)"},
				{3, "channels.lab.inbound.file.error_dir", "is required: where files that are not HL7 go"},
			},
		},
		{
			name: "conflicting and bad settings",
			doc: `
channels:
  lab:
    inbound:
      file: {pattern: "sub/*.hl7", poll: 0s, settle: -1s, move_to: /in/done, delete: true, error_dir: /in/done, max_file_size: 0}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`,
			want: []wantErr{
				{4, "channels.lab.inbound.file.directory", "is required: the directory to take files from"},
				{4, "channels.lab.inbound.file.pattern", "names a path"},
				{4, "channels.lab.inbound.file.poll", "must be > 0"},
				{4, "channels.lab.inbound.file.settle", "must be 0 or more"},
				{4, "channels.lab.inbound.file.delete", "is true but move_to is set too"},
				{4, "channels.lab.inbound.file.error_dir", "is also move_to"},
				{4, "channels.lab.inbound.file.max_file_size", "must be from 1 byte to 1GiB"},
			},
		},
		{
			name: "two channels, one directory, and a bad glob",
			doc: `
channels:
  a:
    inbound: {file: {directory: /in, move_to: /in, error_dir: /err}}
    routes: [{destinations: [out]}]
  b:
    inbound: {file: {directory: /in/, pattern: "[", delete: true, error_dir: /err}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`,
			want: []wantErr{
				{3, "channels.a.inbound.file.move_to", "is the directory files are taken from"},
				{6, "channels.b.inbound.file.directory", `is already channel "a"'s directory`},
				{6, "channels.b.inbound.file.pattern", `"[" is not a file name pattern`},
			},
		},
		{
			name: "mllp and file on one channel",
			doc: `
channels:
  lab:
    inbound: {mllp: {listen: 127.0.0.1:2575}, file: {directory: /in, delete: true, error_dir: /err}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`,
			want: []wantErr{{3, "channels.lab.inbound.file", "a channel has one inbound"}},
		},
	})
}

func TestHTTPDestinationLoads(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [hie]}]
destinations:
  hie:
    type: http
    http:
      url: https://hie.example.org/hl7
      headers: {Authorization: "Bearer ${HIE_TOKEN}", content-type: "x-application/hl7-v2+er7"}
      timeout: 10s
      tls: {ca_file: /etc/mefor/hie-ca.crt}
    retry: {max_attempts: 0, backoff: 1s, max_backoff: 5m}
    on_client_error: retry
    reply_to: adt
`, map[string]string{"HIE_TOKEN": "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Destination("hie")
	h := d.HTTP
	if h == nil || h.URL != "https://hie.example.org/hl7" || h.Method != "POST" || h.Timeout != 10*time.Second {
		t.Fatalf("http %+v", h)
	}
	wantHeaders := []config.HTTPHeader{{Name: "Authorization", Value: "Bearer s3cret"}, {Name: "Content-Type", Value: "x-application/hl7-v2+er7"}}
	if len(h.Headers) != 2 || h.Headers[0] != wantHeaders[0] || h.Headers[1] != wantHeaders[1] {
		t.Fatalf("headers %+v, want %+v", h.Headers, wantHeaders)
	}
	if !h.TLS.Enabled || h.TLS.ServerName != "hie.example.org" || h.TLS.CAFile != "/etc/mefor/hie-ca.crt" {
		t.Fatalf("tls %+v", h.TLS)
	}
	if d.OnClientError != config.ClientErrorRetry || d.ReplyTo != "adt" || d.ReplyDepthLimit != 8 {
		t.Fatalf("destination %+v", d)
	}
}

func TestHTTPDestinationErrors(t *testing.T) {
	secret := "Bearer top\nsecret"
	_, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [a, b, c, d]}]
destinations:
  a:
    type: http
    http: {url: "http://user:pw@hie.example.org/hl7", method: GET}
  b:
    type: http
    http: {url: "http://hie.example.org/hl7", tls: {ca_file: ca.crt}, headers: {Authorization: "${TOKEN}", Host: x, "bad name": y}}
  c:
    type: http
    http: {timeout: 0s}
    on_client_error: maybe
  d:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    on_client_error: retry
`, map[string]string{"TOKEN": secret})
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("an error shows a header value: %v", err)
	}
	checkErrs(t, err, []wantErr{
		{8, "destinations.a.http.url", "carries a user name or password"},
		{8, "destinations.a.http.method", `"GET" is not supported`},
		{11, "destinations.b.http.tls", "applies to https:// URLs only"},
		{11, "destinations.b.http.headers.Authorization", "has a line break or NUL"},
		{11, "destinations.b.http.headers.Host", "is set by mefor"},
		{11, "destinations.b.http.headers.bad name", "is not a header name"},
		{14, "destinations.c.http.url", "is required"},
		{14, "destinations.c.http.timeout", "must be > 0"},
		{15, "destinations.c.on_client_error", `"maybe" is not an on_client_error policy`},
		{19, "destinations.d.on_client_error", "only applies to type: http"},
	})
}

func TestReplyTo(t *testing.T) {
	// A channel that only takes replies needs no inbound.
	c, err := parse(t, `
channels:
  orders:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab]}]
  replies:
    routes: [{destinations: [archive]}]
destinations:
  lab:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    reply_to: replies
    reply_depth_limit: 3
  archive: {type: file, file: {directory: ./out}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Destination("lab"); d.ReplyTo != "replies" || d.ReplyDepthLimit != 3 {
		t.Fatalf("lab %+v", d)
	}

	_, err = parse(t, `
channels:
  orders:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, archive]}]
  lonely:
    routes: [{destinations: [archive]}]
destinations:
  lab:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    reply_to: replys
    reply_depth_limit: 0
  archive: {type: file, file: {directory: ./out}, reply_to: orders}
`, nil)
	checkErrs(t, err, []wantErr{
		{5, "channels.lonely.inbound", "is required: where the channel receives messages"},
		{11, "destinations.lab.reply_to", `"replys" is not a channel`},
		{12, "destinations.lab.reply_depth_limit", "must be from 1 to 100"},
		{13, "destinations.archive.reply_to", "does not apply to type: file"},
	})
}

func TestRecordBatch(t *testing.T) {
	c, err := parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, billing]}]
destinations:
  lab:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    record_batch: {rows: 1}
  billing: {type: mllp, mllp: {address: 127.0.0.1:2577}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Destination("lab").RecordBatch, (config.RecordBatch{Rows: 1, Window: 5 * time.Millisecond}); got != want {
		t.Errorf("lab record_batch %+v, want %+v", got, want)
	}
	if got, want := c.Destination("billing").RecordBatch, (config.RecordBatch{Rows: 32, Window: 5 * time.Millisecond}); got != want {
		t.Errorf("billing record_batch %+v, want the defaults %+v", got, want)
	}

	_, err = parse(t, `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [lab, billing]}]
destinations:
  lab:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
    record_batch: {rows: 0, window: 2s}
  billing:
    type: mllp
    mllp: {address: 127.0.0.1:2577}
    record_batch: {row: 3}
`, nil)
	checkErrs(t, err, []wantErr{
		{9, "destinations.lab.record_batch.rows", "must be from 1 to 1000"},
		{9, "destinations.lab.record_batch.window", "at most 1s"},
		{13, "destinations.billing.record_batch.row", "did you mean rows?"},
	})
}

func TestRetryBackoff(t *testing.T) {
	r := config.Retry{InitialBackoff: time.Second, Multiplier: 2, MaxBackoff: 5 * time.Minute}
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{-1, time.Second}, // below 1 counts as the first attempt
		{0, time.Second},
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{9, 256 * time.Second},
		{10, 5 * time.Minute}, // 512s, capped
		{64, 5 * time.Minute},
		{100_000, 5 * time.Minute}, // 2^99999 overflows float64 to +Inf
		{math.MaxInt, 5 * time.Minute},
	}
	for _, tt := range tests {
		if got := r.Backoff(tt.attempt); got != tt.want {
			t.Errorf("Backoff(%d) = %v, want %v", tt.attempt, got, tt.want)
		}
	}

	constant := config.Retry{InitialBackoff: 3 * time.Second, Multiplier: 1, MaxBackoff: time.Minute}
	if got := constant.Backoff(1000); got != 3*time.Second {
		t.Errorf("multiplier 1: Backoff(1000) = %v, want 3s", got)
	}

	fractional := config.Retry{InitialBackoff: time.Second, Multiplier: 1.5, MaxBackoff: time.Minute}
	if got := fractional.Backoff(3); got != 2250*time.Millisecond {
		t.Errorf("multiplier 1.5: Backoff(3) = %v, want 2.25s", got)
	}

	// Without a cap the wait saturates instead of wrapping around to a
	// negative duration.
	uncapped := config.Retry{InitialBackoff: time.Hour, Multiplier: 10}
	for _, attempt := range []int{10, 20, 1000} {
		if got := uncapped.Backoff(attempt); got != math.MaxInt64 {
			t.Errorf("uncapped: Backoff(%d) = %v, want the largest duration", attempt, got)
		}
	}
}

func TestRetryExhausted(t *testing.T) {
	forever := config.Retry{MaxAttempts: 0}
	if forever.Exhausted(1_000_000) {
		t.Error("max_attempts 0 should retry forever")
	}
	three := config.Retry{MaxAttempts: 3}
	for attempts, want := range []bool{false, false, false, true, true} {
		if got := three.Exhausted(attempts); got != want {
			t.Errorf("Exhausted(%d) = %v, want %v", attempts, got, want)
		}
	}
}
