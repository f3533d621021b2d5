package script_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
)

// BenchmarkRun is the CPU cost of one transform of the js-1lane script's
// kind: a few gets and sets, a lookup, a state write.
func BenchmarkRun(b *testing.B) {
	p := program(b, `function transform(msg, ctx) {
  var mrn = msg.get("PID-3.1");
  if (mrn.indexOf("TEST") === 0) return null;
  msg.set("PID-3.1", "GH" + ("00000000" + mrn.replace(/\D/g, "")).slice(-8));
  msg.set("PID-3.4", "GHLAB");
  var label = ctx.lookup("codes", msg.get("PID-8"));
  if (label !== null) msg.set("PID-8", label);
  msg.set("MSH-5", "LIS");
  ctx.state.set("last-visit", mrn, {at: msg.get("MSH-7"), ward: msg.get("PV1-3.1")});
}`, func(_ *config.JavaScript, o *script.Options) {
		o.Lookup, o.Sets = lookups{"F": "female"}, []string{"codes"}
	})
	msg := parse(b, adt)
	batch := state.NewBatch(state.Map{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Run(context.Background(), script.Input{Message: msg, Destinations: []string{"lab"}, State: batch.Row()}); err != nil {
			b.Fatal(err)
		}
	}
}
