package config_test

import (
	"testing"

	"github.com/mefor/mefor/internal/config"
)

// An MLLP listener keeps 64 KiB of an unparseable frame, closes a
// connection after 20 of them in a row, and does not pace its senders,
// unless the file says otherwise.
func TestMLLPInboundLimits(t *testing.T) {
	c, err := parse(t, minimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := c.Channel("adt").Inbound.MLLP
	if in.KeepUnparseable != 64<<10 || in.MaxUnparseableInARow != 20 || in.MaxMessagesPerSecond != 0 {
		t.Errorf("defaults: keep_unparseable %d, max_unparseable_in_a_row %d, max_messages_per_second %g; want 65536, 20, 0",
			in.KeepUnparseable, in.MaxUnparseableInARow, in.MaxMessagesPerSecond)
	}

	c, err = parse(t, `
channels:
  adt:
    inbound:
      mllp: {listen: 127.0.0.1:2575, keep_unparseable: 4KiB, max_unparseable_in_a_row: 3, max_messages_per_second: 2.5}
    routes:
      - destinations: [out]
destinations:
  out:
    type: mllp
    mllp: {address: 127.0.0.1:2576}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	in = c.Channel("adt").Inbound.MLLP
	if in.KeepUnparseable != 4<<10 || in.MaxUnparseableInARow != 3 || in.MaxMessagesPerSecond != 2.5 {
		t.Errorf("given: %+v", in)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", c.Warnings)
	}
}

func TestMLLPInboundLimitsValidation(t *testing.T) {
	_, err := parse(t, `
channels:
  a:
    inbound: {mllp: {listen: "127.0.0.1:2575", keep_unparseable: 0, max_unparseable_in_a_row: 0, max_messages_per_second: 0}}
    routes: [{destinations: [out]}]
  b:
    inbound: {mllp: {listen: "127.0.0.1:2576", keep_unparseable: 64KB, max_unparseable_in_a_row: many, max_messages_per_second: 2000000}}
    routes: [{destinations: [out]}]
  c:
    inbound: {mllp: {listen: "127.0.0.1:2577", max_unparseable_in_a_row: -1, max_messages_per_second: fast}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: "127.0.0.1:2576"}}
`, nil)
	checkErrs(t, err, []wantErr{
		{3, "channels.a.inbound.mllp.keep_unparseable", "must be at least 1 byte (e.g. keep_unparseable: 64KiB)"},
		{3, "channels.a.inbound.mllp.max_unparseable_in_a_row", "must be at least 1 (e.g. max_unparseable_in_a_row: 20)"},
		{3, "channels.a.inbound.mllp.max_messages_per_second", "must be more than 0 and at most 1000000 (e.g. max_messages_per_second: 50), or left out for no limit"},
		{6, "channels.b.inbound.mllp.keep_unparseable", "sizes use binary units; did you mean 64KiB?"},
		{6, "channels.b.inbound.mllp.max_unparseable_in_a_row", `"many" is not a whole number`},
		{6, "channels.b.inbound.mllp.max_messages_per_second", "must be more than 0 and at most 1000000"},
		{9, "channels.c.inbound.mllp.max_unparseable_in_a_row", "must be at least 1"},
		{9, "channels.c.inbound.mllp.max_messages_per_second", `"fast" is not a number`},
	})

	// Keeping more than a frame can hold is harmless but a mistake.
	c, err := parse(t, `
channels:
  a:
    inbound: {mllp: {listen: "127.0.0.1:2575", max_frame_size: 64KiB, keep_unparseable: 1MiB}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: "127.0.0.1:2576"}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkErrs(t, config.Errors(c.Warnings), []wantErr{
		{3, "channels.a.inbound.mllp.keep_unparseable", "(1048576 bytes) is more than max_frame_size (65536 bytes)"},
	})
}
