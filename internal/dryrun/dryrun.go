// Package dryrun runs one handler on sample messages without a database and
// reports what a node would do with each: the output messages, where they
// go, filtered or failed, the state writes and the script's log lines. It
// is what `mefor handler test` prints, and what the API's dry run returns;
// the run itself is internal/engine's DryRun, as the transform stage would
// run it.
package dryrun

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/state"
)

// Outcomes of one message (Result.Outcome).
const (
	// OutcomeDelivered: the handler produced at least one output message.
	OutcomeDelivered = "delivered"
	// OutcomeFiltered: the handler produced none; nothing is delivered.
	OutcomeFiltered = "filtered"
	// OutcomeFailed: the message did not parse, or the handler failed; a
	// node dead-letters it.
	OutcomeFailed = "failed"
	// OutcomeHeld: the handler failed and a node would keep the lane
	// waiting at the message, retrying.
	OutcomeHeld = "held"
)

// Report is the whole dry run: the route it ran as and every message's
// result, in order.
type Report struct {
	Handler      string   `json:"handler"`
	Channel      string   `json:"channel"`
	Route        string   `json:"route"`
	Destinations []string `json:"destinations"`
	// Warnings say what the dry run cannot do like a node would.
	Warnings []string `json:"warnings,omitempty"`
	Messages []Result `json:"messages"`
	Summary  Summary  `json:"summary"`
}

// Result is what the handler did with one message.
type Result struct {
	File        string       `json:"file"`
	Index       int          `json:"index"` // 1-based within the file
	ControlID   string       `json:"control_id,omitempty"`
	Type        string       `json:"type,omitempty"`
	Outcome     string       `json:"outcome"` // one of the Outcome constants
	Error       string       `json:"error,omitempty"`
	Outputs     []Output     `json:"outputs,omitempty"`
	StateWrites []StateWrite `json:"state_writes,omitempty"`
	Logs        []LogLine    `json:"logs,omitempty"`

	input *hl7.Message
}

// Output is one output message, segment by segment, and where it goes.
type Output struct {
	Destinations []string `json:"destinations"`
	Segments     []string `json:"segments"`
}

// StateWrite is one write to transform state.
type StateWrite struct {
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`    // null: deleted
	Previous  json.RawMessage `json:"previous"` // null: absent before
}

// LogLine is one line the script logged (ctx.log).
type LogLine struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

// Summary counts the results by outcome; Failed includes the held ones.
type Summary struct {
	Messages  int `json:"messages"`
	Delivered int `json:"delivered"`
	Outputs   int `json:"outputs"`
	Filtered  int `json:"filtered"`
	Failed    int `json:"failed"`
}

// Options configure New.
type Options struct {
	// Route is "channel/route" to run the handler as. Defaults to the
	// first route that uses the handler.
	Route string
	// State seeds transform state before the first message. Defaults to
	// empty.
	State map[state.Key]json.RawMessage
}

// DryRun runs one handler of a loaded config on samples, in order, as one
// lane would: a later message sees the state an earlier one wrote.
type DryRun struct {
	run *engine.DryRun
	rep Report
}

// New prepares the handler named handler of cfg (scripts compiled,
// reference sets read from their CSV files).
func New(ctx context.Context, cfg *config.Config, handler string, opts Options) (*DryRun, error) {
	run, err := engine.NewDryRun(ctx, cfg, handler, engine.DryRunOptions{Route: opts.Route, State: opts.State})
	if err != nil {
		return nil, err
	}
	d := &DryRun{run: run, rep: Report{Handler: handler, Warnings: run.Warnings}}
	d.rep.Channel, d.rep.Route, d.rep.Destinations = run.Route()
	return d, nil
}

// RunFile runs the handler on each message of data (several per file, any
// line endings), naming them by file and position. A message that does not
// parse is a failed result; the others still run.
func (d *DryRun) RunFile(ctx context.Context, file string, data []byte) {
	for i, raw := range hl7.SplitMessages(data) {
		r := Result{File: file, Index: i + 1}
		msg, err := hl7.Parse(raw)
		if err != nil {
			r.Outcome, r.Error = OutcomeFailed, fmt.Sprintf("not an HL7 message: %v", err)
			d.rep.Messages = append(d.rep.Messages, r)
			continue
		}
		r.input, r.ControlID, r.Type = msg, msg.ControlID(), messageType(msg)
		fill(&r, d.run.Run(ctx, msg))
		d.rep.Messages = append(d.rep.Messages, r)
	}
}

// Report returns the results so far, with their summary.
func (d *DryRun) Report() *Report {
	rep := d.rep
	rep.Summary = Summary{}
	for _, r := range rep.Messages {
		rep.Summary.Messages++
		switch r.Outcome {
		case OutcomeDelivered:
			rep.Summary.Delivered++
			rep.Summary.Outputs += len(r.Outputs)
		case OutcomeFiltered:
			rep.Summary.Filtered++
		default:
			rep.Summary.Failed++
		}
	}
	return &rep
}

func fill(r *Result, res engine.DryResult) {
	switch {
	case res.Err != nil && res.Held:
		r.Outcome, r.Error = OutcomeHeld, res.Err.Error()
	case res.Err != nil:
		r.Outcome, r.Error = OutcomeFailed, res.Err.Error()
	case len(res.Outputs) == 0:
		r.Outcome = OutcomeFiltered
	default:
		r.Outcome = OutcomeDelivered
	}
	for _, o := range res.Outputs {
		r.Outputs = append(r.Outputs, Output{Destinations: o.Destinations, Segments: segmentTexts(o.Message)})
	}
	for _, w := range res.Writes {
		r.StateWrites = append(r.StateWrites, StateWrite{
			Namespace: w.Key.Namespace, Key: w.Key.Key, Value: orNull(w.Value), Previous: orNull(w.Previous),
		})
	}
	for _, l := range res.Logs {
		r.Logs = append(r.Logs, LogLine{Level: strings.ToLower(l.Level.String()), Text: l.Text})
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
