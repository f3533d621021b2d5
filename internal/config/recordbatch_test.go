package config_test

import (
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

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
