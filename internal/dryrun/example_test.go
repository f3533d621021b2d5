package dryrun_test

import (
	"context"
	"fmt"
	"log"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/dryrun"
)

// A dry run of a map handler on two messages: the first is delivered with
// its receiving application rewritten and its note text cleared; the
// second is not HL7 and fails on its own, without stopping the run.
func Example() {
	cfg, err := config.Parse("mefor.yaml", []byte(`
channels:
  orders:
    inbound: {mllp: {listen: "127.0.0.1:12575"}}
    routes:
      - {name: to-lab, handler: relabel, destinations: [lab]}
handlers:
  relabel:
    type: map
    map:
      - set: {path: MSH-5, value: LAB}
      - clear: {path: NTE-3}
destinations:
  lab: {type: mllp, mllp: {address: "127.0.0.1:12576"}}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	dry, err := dryrun.New(ctx, cfg, "relabel", dryrun.Options{})
	if err != nil {
		log.Fatal(err)
	}
	dry.RunFile(ctx, "orders.hl7", []byte("MSH|^~\\&|HIS|HOSP|ORDERS|HOSP|20250301120000||ORM^O01|M1|P|2.5.1\r"+
		"PID|1||123^^^HOSP^MR\rNTE|1||fasting\r"))
	dry.RunFile(ctx, "junk.txt", []byte("not a message"))

	rep := dry.Report()
	fmt.Printf("as %s/%s to %v\n", rep.Channel, rep.Route, rep.Destinations)
	for _, r := range rep.Messages {
		if r.Error != "" {
			fmt.Printf("%s #%d: %s (%s)\n", r.File, r.Index, r.Outcome, r.Error)
			continue
		}
		fmt.Printf("%s #%d %s %s: %s\n", r.File, r.Index, r.Type, r.ControlID, r.Outcome)
		for _, o := range r.Outputs {
			for _, line := range r.Diff(o) {
				fmt.Println("  " + line)
			}
		}
	}
	s := rep.Summary
	fmt.Printf("%d messages: %d delivered, %d filtered, %d failed\n", s.Messages, s.Delivered, s.Filtered, s.Failed)
	// Output:
	// as orders/to-lab to [lab]
	// orders.hl7 #1 ORM^O01 M1: delivered
	//   ~ MSH|^~\&|HIS|HOSP|LAB|HOSP|20250301120000||ORM^O01|M1|P|2.5.1
	//     PID|1||123^^^HOSP^MR
	//   ~ NTE|1||
	// junk.txt #1: failed (not an HL7 message: hl7: message does not start with an MSH segment (segment 1, byte 0))
	// 2 messages: 1 delivered, 0 filtered, 1 failed
}
