package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/testcontainers"
)

// benchHandler sets a scenario's handler up: it returns the handler name
// the routes use and the config it needs (handlers:, reference_sets:).
type benchHandler func(b testing.TB, db *testcontainers.DB) (name, yaml string)

// jsBenchScript is a realistic transform: a few gets and sets, a filter,
// one reference lookup and one state write per message.
const jsBenchScript = `function transform(msg, ctx) {
  var mrn = msg.get("PID-3.1");
  if (mrn.indexOf("TEST") === 0) return null;
  msg.set("PID-3.1", "GH" + ("00000000" + mrn.replace(/\D/g, "")).slice(-8));
  msg.set("PID-3.4", "GHLAB");
  var label = ctx.lookup("sex", msg.get("PID-8"));
  if (label !== null) msg.set("PID-8", label);
  var ward = msg.get("PV1-3.1");
  msg.set("PV1-3.1", "LAB-" + ward);
  msg.set("MSH-5", "LIS");
  msg.set("MSH-6", "GOODHEALTH");
  ctx.state.set("last-visit", mrn, {at: msg.get("MSH-7"), ward: ward});
  ctx.log.info("sent to the lab");
  return msg;
}`

// jsBenchHandler runs jsBenchScript, with its reference set synced before
// the node starts so no message waits for it.
func jsBenchHandler(b testing.TB, db *testcontainers.DB) (string, string) {
	dir := b.TempDir()
	js := writeScript(b, dir, "bench.js", jsBenchScript)
	csv := writeScript(b, dir, "sex.csv", "code,label\nF,female\nM,male\nU,unknown\n")
	yaml := fmt.Sprintf(`handlers:
  js: {type: javascript, javascript: {file: %q}}
reference_sets:
  sex: {source: {csv: {path: %q}}}
`, js, csv)
	set := &config.ReferenceSet{Name: "sex", Source: config.ReferenceSource{CSV: &config.CSVSource{Path: csv}}}
	if _, err := (&reference.Syncer{Pool: db.Pool, NodeID: "bench"}).Sync(context.Background(), set); err != nil {
		b.Fatalf("sync the bench reference set: %v", err)
	}
	return "js", yaml
}
