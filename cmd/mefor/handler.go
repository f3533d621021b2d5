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
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
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

// handlerTestReport is the --json document.
type handlerTestReport struct {
	Handler      string              `json:"handler"`
	Channel      string              `json:"channel"`
	Route        string              `json:"route"`
	Destinations []string            `json:"destinations"`
	Warnings     []string            `json:"warnings,omitempty"`
	Messages     []handlerTestResult `json:"messages"`
	Summary      handlerTestSummary  `json:"summary"`
}

type handlerTestResult struct {
	File        string               `json:"file"`
	Index       int                  `json:"index"` // 1-based within the file
	ControlID   string               `json:"control_id,omitempty"`
	Type        string               `json:"type,omitempty"`
	Outcome     string               `json:"outcome"` // delivered, filtered, failed, held
	Error       string               `json:"error,omitempty"`
	Outputs     []handlerTestOutput  `json:"outputs,omitempty"`
	StateWrites []handlerTestWrite   `json:"state_writes,omitempty"`
	Logs        []handlerTestLogLine `json:"logs,omitempty"`

	input *hl7.Message
}

type handlerTestOutput struct {
	Destinations []string `json:"destinations"`
	Segments     []string `json:"segments"`
}

type handlerTestWrite struct {
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`    // null: deleted
	Previous  json.RawMessage `json:"previous"` // null: absent before
}

type handlerTestLogLine struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

type handlerTestSummary struct {
	Messages  int `json:"messages"`
	Delivered int `json:"delivered"`
	Outputs   int `json:"outputs"`
	Filtered  int `json:"filtered"`
	Failed    int `json:"failed"`
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
	dry, err := engine.NewDryRun(ctx, cfg, c.Name, engine.DryRunOptions{Route: c.Route, State: seed})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	rep := handlerTestReport{Handler: c.Name, Warnings: dry.Warnings}
	rep.Channel, rep.Route, rep.Destinations = dry.Route()

	for _, file := range c.Files {
		data, err := readSample(file, g)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		for i, raw := range hl7.SplitMessages(data) {
			r := handlerTestResult{File: file, Index: i + 1}
			msg, err := hl7.Parse(raw)
			if err != nil {
				r.Outcome, r.Error = "failed", fmt.Sprintf("not an HL7 message: %v", err)
				rep.Messages = append(rep.Messages, r)
				continue
			}
			r.input, r.ControlID, r.Type = msg, msg.ControlID(), messageType(msg)
			fillResult(&r, dry.Run(ctx, msg))
			rep.Messages = append(rep.Messages, r)
		}
	}
	for _, r := range rep.Messages {
		rep.Summary.Messages++
		switch r.Outcome {
		case "delivered":
			rep.Summary.Delivered++
			rep.Summary.Outputs += len(r.Outputs)
		case "filtered":
			rep.Summary.Filtered++
		default:
			rep.Summary.Failed++
		}
	}

	if c.JSON {
		if err := writeJSON(g.stdout, rep); err != nil {
			return err
		}
	} else {
		printHandlerTest(g.stdout, &rep)
	}
	if rep.Summary.Failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}

func fillResult(r *handlerTestResult, res engine.DryResult) {
	switch {
	case res.Err != nil && res.Held:
		r.Outcome, r.Error = "held", res.Err.Error()
	case res.Err != nil:
		r.Outcome, r.Error = "failed", res.Err.Error()
	case len(res.Outputs) == 0:
		r.Outcome = "filtered"
	default:
		r.Outcome = "delivered"
	}
	for _, o := range res.Outputs {
		r.Outputs = append(r.Outputs, handlerTestOutput{Destinations: o.Destinations, Segments: segmentTexts(o.Message)})
	}
	for _, w := range res.Writes {
		r.StateWrites = append(r.StateWrites, handlerTestWrite{
			Namespace: w.Key.Namespace, Key: w.Key.Key, Value: orNull(w.Value), Previous: orNull(w.Previous),
		})
	}
	for _, l := range res.Logs {
		r.Logs = append(r.Logs, handlerTestLogLine{Level: strings.ToLower(l.Level.String()), Text: l.Text})
	}
}

func orNull(v json.RawMessage) json.RawMessage {
	if v == nil {
		return json.RawMessage("null")
	}
	return v
}

func segmentTexts(m *hl7.Message) []string {
	out := make([]string, m.SegmentCount())
	for i := range out {
		out[i] = m.SegmentText(i)
	}
	return out
}

func messageType(m *hl7.Message) string {
	if t := m.TriggerEvent(); t != "" {
		return m.MessageType() + "^" + t
	}
	return m.MessageType()
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
func printHandlerTest(w io.Writer, rep *handlerTestReport) {
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
			for _, line := range diffSegments(r.input, o.Segments) {
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

// diffSegments marks an output's segments against the input: "  " the
// same, "~ " changed (same segment id and occurrence), "+ " added; input
// segments the output lacks follow as "- ".
func diffSegments(in *hl7.Message, out []string) []string {
	type occ struct {
		id string
		n  int
	}
	inText := map[occ]string{}
	count := map[string]int{}
	var order []occ
	for _, s := range segmentTexts(in) {
		id := segID(s)
		count[id]++
		o := occ{id, count[id]}
		inText[o] = s
		order = append(order, o)
	}
	seen := map[occ]bool{}
	count = map[string]int{}
	var lines []string
	for _, s := range out {
		id := segID(s)
		count[id]++
		o := occ{id, count[id]}
		seen[o] = true
		prev, ok := inText[o]
		switch {
		case !ok:
			lines = append(lines, "+ "+s)
		case prev != s:
			lines = append(lines, "~ "+s)
		default:
			lines = append(lines, "  "+s)
		}
	}
	for _, o := range order {
		if !seen[o] {
			lines = append(lines, "- "+inText[o])
		}
	}
	return lines
}

func segID(s string) string {
	if len(s) < 3 {
		return s
	}
	return s[:3]
}
