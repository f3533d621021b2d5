package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/dryrun"
	"github.com/mefor/mefor/internal/state"
)

type handlerCmd struct {
	Test handlerTestCmd `cmd:"" help:"Run one handler on sample messages without the database: each output message, where it goes, filtered or not, state writes."`
}

type handlerTestCmd struct {
	Config string   `name:"config" required:"" type:"existingfile" placeholder:"FILE" help:"Config file holding the handler."`
	Name   string   `arg:"" help:"Handler to run."`
	Files  []string `arg:"" name:"message-file" help:"Files of HL7 messages (several per file, any line endings); - reads standard input."`
	State  []string `name:"state" sep:"none" placeholder:"NAMESPACE/KEY=JSON" help:"Seed transform state before the first message, e.g. --state 'visits/12345=3'. Repeatable."`
	Route  string   `name:"route" placeholder:"CHANNEL/ROUTE" help:"Run as this route (its destinations, ctx.channel, ctx.route); default: the first route using the handler."`
	JSON   bool     `name:"json" help:"Print the results as JSON."`
}

func (c *handlerTestCmd) Help() string {
	return `Loads the config as 'mefor run' would (scripts compiled, reference sets from
their CSV files), then runs the handler on each message in order, as one lane
would: a later message sees the state an earlier one wrote. Nothing is stored,
sent or read from the database.

For each message it prints the output messages segment by segment, marking
segments the handler added (+), changed (~) or removed (-), the destinations
each goes to, "filtered" when nothing is delivered, the state writes with the
values they replace, and the script's ctx.log lines. A failing message shows
the script's error and line, as a node would record it. Exit status 1 when
any message fails.

Examples:
  mefor handler test --config examples/scripting/mefor.yaml to-lab examples/scripting/samples/adt.hl7
  mefor handler test --config mefor.yaml visits --state 'visits/12345=3' adt.hl7
  cat adt.hl7 | mefor handler test --config mefor.yaml visits - --json | jq '.messages[].outputs'`
}

func (c *handlerTestCmd) Run(ctx context.Context, g *Globals) error {
	cfg, err := config.Load(c.Config)
	if err != nil {
		var errs config.Errors
		if errors.As(err, &errs) {
			for _, e := range errs {
				fmt.Fprintln(g.stderr, e.Error())
			}
			return &exitError{code: 1, err: fmt.Errorf("%s: %d problems; fix them first (mefor config check %s)", c.Config, len(errs), c.Config)}
		}
		return err
	}
	seed, err := parseStateFlags(c.State)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	dry, err := dryrun.New(ctx, cfg, c.Name, dryrun.Options{Route: c.Route, State: seed})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	for _, file := range c.Files {
		data, err := readSample(file, g)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		dry.RunFile(ctx, file, data)
	}
	rep := dry.Report()

	if c.JSON {
		if err := writeJSON(g.stdout, rep); err != nil {
			return err
		}
	} else {
		printHandlerTest(g.stdout, rep)
	}
	if rep.Summary.Failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}

// readSample reads a sample file, or standard input for "-".
func readSample(file string, g *Globals) ([]byte, error) {
	if file == "-" {
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("read standard input: %w", err)
		}
		return data, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read sample: %w", err)
	}
	return data, nil
}

// parseStateFlags reads --state NAMESPACE/KEY=JSON values. The key is what
// follows the first slash, so keys may contain slashes; namespaces cannot.
func parseStateFlags(flags []string) (map[state.Key]json.RawMessage, error) {
	out := map[state.Key]json.RawMessage{}
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		ns, key, okKey := strings.Cut(name, "/")
		if !ok || !okKey {
			return nil, fmt.Errorf("--state %q: write NAMESPACE/KEY=JSON, e.g. --state 'visits/12345=3' or --state 'clinic/hours={\"open\":8}'", f)
		}
		if err := state.CheckKey(ns, key); err != nil {
			return nil, fmt.Errorf("--state %q: %v", f, err)
		}
		if !json.Valid([]byte(value)) {
			return nil, fmt.Errorf("--state %q: the value is not JSON; quote strings, e.g. --state '%s/%s=\"text\"'", f, ns, key)
		}
		out[state.Key{Namespace: ns, Key: key}] = json.RawMessage(value)
	}
	return out, nil
}

// printHandlerTest writes the human-readable report.
func printHandlerTest(w io.Writer, rep *dryrun.Report) {
	dests := strings.Join(rep.Destinations, ", ")
	if dests == "" {
		dests = "no destinations"
	}
	fmt.Fprintf(w, "handler %s, as route %s/%s (%s)\n", rep.Handler, rep.Channel, rep.Route, dests)
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	for _, r := range rep.Messages {
		fmt.Fprintf(w, "\n%s #%d", r.File, r.Index)
		if r.ControlID != "" || r.Type != "" {
			fmt.Fprintf(w, ": %s %s", r.Type, r.ControlID)
		}
		fmt.Fprintln(w)
		for _, l := range r.Logs {
			fmt.Fprintf(w, "  log %s: %s\n", l.Level, l.Text)
		}
		switch r.Outcome {
		case "failed":
			fmt.Fprintf(w, "  FAILED (a node dead-letters it): %s\n", r.Error)
		case "held":
			fmt.Fprintf(w, "  HELD (a node keeps the lane waiting at it, retrying): %s\n", r.Error)
		case "filtered":
			fmt.Fprintln(w, "  filtered: nothing is delivered")
		}
		for i, o := range r.Outputs {
			to := strings.Join(o.Destinations, ", ")
			if to == "" {
				to = "no destination"
			}
			fmt.Fprintf(w, "  output %d of %d → %s\n", i+1, len(r.Outputs), to)
			for _, line := range r.Diff(o) {
				fmt.Fprintf(w, "    %s\n", line)
			}
		}
		for _, s := range r.StateWrites {
			if string(s.Value) == "null" {
				fmt.Fprintf(w, "  state %s/%s deleted (was %s)\n", s.Namespace, s.Key, s.Previous)
				continue
			}
			was := ""
			if string(s.Previous) != "null" {
				was = " (was " + string(s.Previous) + ")"
			}
			fmt.Fprintf(w, "  state %s/%s = %s%s\n", s.Namespace, s.Key, s.Value, was)
		}
	}
	s := rep.Summary
	fmt.Fprintf(w, "\n%d messages: %d delivered (%d output messages), %d filtered, %d failed\n",
		s.Messages, s.Delivered, s.Outputs, s.Filtered, s.Failed)
}
